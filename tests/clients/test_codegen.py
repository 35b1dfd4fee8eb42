"""Other languages: the proto's package options, and the README's codegen commands as printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
SETUP = "run `make codegen-tools` (Debian: protobuf-compiler protoc-gen-go protoc-gen-go-grpc)"

# Pinned here because buf's breaking check lets them be set once (proto/buf.yaml).
OPTIONS = {
    "go_package": "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1;systempromptv1",
    "java_package": "dev.dsh.systemprompt.v1",
    "java_multiple_files": True,
    "java_outer_classname": "SystemPromptProto",
    "csharp_namespace": "Dsh.SystemPrompt.V1",
    "php_namespace": "Dsh\\SystemPrompt\\V1",
    "ruby_package": "Dsh::SystemPrompt::V1",
    "objc_class_prefix": "DSP",
}


def readme_codegen_commands() -> list[str]:
    """The shell commands of the README block marked `<!-- codegen -->`, continuations joined."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- codegen -->\n```sh\n(.*?)```", text, re.S)
    assert block is not None, "README.md has no <!-- codegen --> block"
    joined = block.group(1).replace("\\\n", " ")
    return [line.split("#")[0].strip() for line in joined.splitlines() if line.strip()]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what the commands read: the proto and buf.gen.yaml."""
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    shutil.copy(ROOT / "buf.gen.yaml", tmp_path)
    return tmp_path


def run(command: str, cwd: Path) -> None:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv's buf
    for tool in ("protoc", "protoc-gen-go", "protoc-gen-go-grpc"):
        if shutil.which(tool, path=path) is None:
            pytest.fail(f"`{tool}` is not on PATH: {SETUP}")
    done = subprocess.run(
        command, shell=True, cwd=cwd, env={**os.environ, "PATH": path}, capture_output=True
    )
    assert done.returncode == 0, f"{command}\n{done.stderr.decode()}"


def test_the_proto_sets_every_languages_package_options() -> None:
    options = pb.DESCRIPTOR.GetOptions()
    assert {name: getattr(options, name) for name in OPTIONS} == OPTIONS


def test_the_readmes_codegen_commands_work_as_printed(checkout: Path) -> None:
    commands = readme_codegen_commands()
    assert commands[0] == "buf generate"
    for command in commands:
        run(command, checkout)
    go = checkout / "gen/go/dsh/systemprompt/v1"
    assert "package systempromptv1" in (go / "system_prompt.pb.go").read_text()
    assert "SystemPromptServiceClient" in (go / "system_prompt_grpc.pb.go").read_text()
    assert (checkout / "gen/java/dev/dsh/systemprompt/v1/ErrorReason.java").is_file()
    assert "namespace Dsh.SystemPrompt.V1" in (checkout / "gen/csharp/SystemPrompt.cs").read_text()


def test_the_readmes_protoc_command_for_go_works_on_its_own(checkout: Path) -> None:
    commands = readme_codegen_commands()
    go_command = next(c for c in commands if "--go_out" in c)
    run("mkdir -p gen/go", checkout)
    run(go_command, checkout)
    go = checkout / "gen/go/dsh/systemprompt/v1"
    assert {p.name for p in go.iterdir()} == {"system_prompt.pb.go", "system_prompt_grpc.pb.go"}


def test_the_go_packages_import_path_is_the_go_client_modules() -> None:
    """go_package names the Go client's generated code, under the module go.mod declares."""
    go_mod = (ROOT / "clients/go/go.mod").read_text(encoding="utf-8")
    module = re.search(r"^module (\S+)$", go_mod, re.M)
    assert module is not None, "clients/go/go.mod declares no module"
    import_path, _, name = str(OPTIONS["go_package"]).partition(";")
    assert import_path == f"{module.group(1)}/gen/dsh/systemprompt/v1"
    generated = ROOT / "clients/go/gen/dsh/systemprompt/v1/system_prompt.pb.go"
    assert f"package {name}" in generated.read_text(encoding="utf-8")
