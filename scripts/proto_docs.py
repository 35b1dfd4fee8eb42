"""Write docs/contract.md from the .proto: every RPC, message, field and enum with its comment.

Usage: python scripts/proto_docs.py [OUTPUT]   (default docs/contract.md; `-` for stdout)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTO = "dsh/systemprompt/v1/system_prompt.proto"
# Source-location paths: where each kind of definition sits in a FileDescriptorProto.
MESSAGE, ENUM, SERVICE, FIELD, ENUM_VALUE, METHOD = 4, 5, 6, 2, 2, 2
SCALARS = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in descriptor_pb2.FieldDescriptorProto.Type.items()
}


def main() -> None:
    output = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "docs" / "contract.md")
    text = render(load())
    if output == "-":
        sys.stdout.write(text)
    else:
        Path(output).write_text(text, encoding="utf-8")


def load() -> descriptor_pb2.FileDescriptorProto:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "descriptor.pb"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                "-I",
                str(ROOT / "proto"),
                "--include_source_info",
                f"--descriptor_set_out={out}",
                PROTO,
            ],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.file[0]


def render(file: descriptor_pb2.FileDescriptorProto) -> str:
    comments = {
        tuple(location.path): _paragraphs(location.leading_comments)
        for location in file.source_code_info.location
    }
    lines = [
        "# The wire contract: `dsh.systemprompt.v1`",
        "",
        f"Generated from `proto/{PROTO}` by `make docs`; do not edit by hand.",
        "",
        _file_comment(file),
    ]
    for s_index, service in enumerate(file.service):
        lines += ["", f"## Service `{service.name}`", "", comments.get((SERVICE, s_index), "")]
        lines += ["", "| RPC | request | response | what it does |", "|---|---|---|---|"]
        for m_index, method in enumerate(service.method):
            request = ("stream " if method.client_streaming else "") + _short(method.input_type)
            response = ("stream " if method.server_streaming else "") + _short(method.output_type)
            what = _cell(comments.get((SERVICE, s_index, METHOD, m_index), ""))
            lines.append(f"| `{method.name}` | `{request}` | `{response}` | {what} |")
    lines += ["", "## Messages"]
    for index, message in enumerate(file.message_type):
        lines += ["", f"### `{message.name}`", "", comments.get((MESSAGE, index), "")]
        if message.field:
            lines += ["", "| field | type | meaning |", "|---|---|---|"]
        for f_index, field in enumerate(message.field):
            meaning = _cell(comments.get((MESSAGE, index, FIELD, f_index), ""))
            lines.append(f"| `{field.name}` | `{_type(field)}` | {meaning} |")
    lines += ["", "## Enums"]
    for index, enum in enumerate(file.enum_type):
        lines += ["", f"### `{enum.name}`", "", comments.get((ENUM, index), "")]
        lines += ["", "| value | number | meaning |", "|---|---|---|"]
        for v_index, value in enumerate(enum.value):
            meaning = _cell(comments.get((ENUM, index, ENUM_VALUE, v_index), ""))
            lines.append(f"| `{value.name}` | {value.number} | {meaning} |")
    return "\n".join(lines).replace("\n\n\n", "\n\n").rstrip() + "\n"


def _file_comment(file: descriptor_pb2.FileDescriptorProto) -> str:
    syntax_path = (12,)  # the comment above `syntax = ...` describes the file
    for location in file.source_code_info.location:
        if tuple(location.path) == syntax_path:
            detached = location.leading_detached_comments
            return _paragraphs(detached[0] if detached else location.leading_comments)
    return ""


def _paragraphs(text: str) -> str:
    return "\n".join(line.strip() for line in text.strip().splitlines())


def _type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    name = _short(field.type_name) if field.type_name else SCALARS[field.type]
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        return f"repeated {name}"
    if field.proto3_optional:
        return f"optional {name}"
    return name


def _short(type_name: str) -> str:
    return type_name.removeprefix(".dsh.systemprompt.v1.")


def _cell(comment: str) -> str:
    return " ".join(comment.split()).replace("|", "\\|")


if __name__ == "__main__":
    main()
