"""Fail when the docs name what does not exist, or leave out what does.

Reads the sources of truth, not hand lists: the CLI's argparse parser, the config
keys' declarations, the metrics registry and
the files in the repository. Checked in README.md, docs/*.md and
deploy/kubernetes/README.md:

- every file path in backticks exists (a bare `name.py` somewhere in the tree);
- every `--flag` of a `dsh-system-prompt` command line, or alone in backticks, is a flag
  of the CLI;
- every key of a config table and of a ```toml block is a config key;
- every `dsp_...` metric name is one the sidecar exports;
and the other way round: docs/operations.md names every `serve` flag, config key and
metric. Everywhere in the tree (docs, READMEs, comments of the code and the proto; not
generated code), a reference to a section, `docs/x.md, "Heading"` (several: `"A" and
"B"`), names a heading of that document. docs/architecture.md has one short line for
every folder of the code and none for a folder that is not; what a module holds is its
docstring's, which every module has (a head comment in TypeScript and Go).

Usage: python scripts/check_docs.py   (exit 1 with one line per problem)
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from dsh_system_prompt_server import SidecarConfig
from dsh_system_prompt_server.config import flat
from dsh_system_prompt_server.registry.rules import RULE_KEYS
from dsh_system_prompt_server.sidecar.cli import build_parser
from dsh_system_prompt_server.sidecar.config import CREDENTIAL_KEYS
from dsh_system_prompt_server.telemetry.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "deploy" / "kubernetes" / "README.md",
]
GENERATED = {"docs/contract.md", "docs/benchmarks.md"}  # made from the proto and the bench
OPERATIONS = ROOT / "docs" / "operations.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("core/dsh_system_prompt_core/", "client/dsh_system_prompt/")
SERVER = "server/dsh_system_prompt_server/"
SOURCES = ("clients/typescript/src/", "clients/go/dsp/")
FOLDER_ROW = re.compile(r"^\| `([^`]+/)` \|")
# One line per folder: longer, it is telling what a module holds, which its docstring says.
MAX_ROW = 240
EXTENSIONS = (
    ".py",
    ".md",
    ".toml",
    ".yaml",
    ".yml",
    ".proto",
    ".sh",
    ".js",
    ".mjs",
    ".ts",
    ".json",
    ".txt",
)
# Made by a command or outside the repository: not in the tree, rightly.
NOT_IN_TREE = (
    ".venv/",
    "gen/",
    "node_modules/",
    "/",
    "~",
    ".",
    "dist/",
    "build/",
    "sidecar.toml",
    "assembly.json",
    "rules.toml",
)
# Files of other projects the docs cite (DeepSeek's model repository, googleapis).
EXTERNAL = {"tokenizer_config.json", "encoding/encoding_dsv32.py", "google/rpc/status.proto"}
CODE = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
METRIC = re.compile(r"\bdsp_[a-z_]*\*?")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
ADD_ARGUMENT = re.compile(r"add_argument\(\s*\"(--[a-z][a-z0-9-]*)\"")
# `docs/protocol.md, "Part slots"`, `docs/protocol.md "A" and "B"`: a reference to a section.
QUOTED = r'"([^"\n]+)"'
HEADING_REF = re.compile(
    rf"(docs/[\w/-]+\.md)`?,?\s+\(?{QUOTED}((?:\s*(?:,|and|or|,\s*and)\s+{QUOTED})*)"
)
# Where references to sections are looked for: every text file but generated code.
REFERRING = (".md", ".py", ".ts", ".go", ".proto", ".mjs", ".js", ".sh", ".toml")
# The check itself and its test show references that are not meant to resolve.
SPEAKS_OF_REFERENCES = {"scripts/check_docs.py", "tests/package/test_docs.py"}
COMMENT_BREAK = re.compile(r"[ \t]*\n[ \t]*(?://+|#+|\*+(?![*/]))?[ \t]*")


def main() -> int:
    problems = list(check())
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("docs name only what exists, operations.md all of it, architecture.md every folder")
    return 0


def check() -> Iterator[str]:
    tracked = tracked_files()
    _, serve_flags = cli_flags()
    metrics = metric_names()
    for doc in DOCS:
        where = doc.relative_to(ROOT).as_posix()
        if where not in GENERATED:
            yield from check_text(where, doc.read_text(encoding="utf-8"), tracked)
    operations = OPERATIONS.read_text(encoding="utf-8")
    yield from missing("docs/operations.md", "serve flag", serve_flags, operations)
    tabled = set(documented_keys(operations))
    for key in sorted(flat(SidecarConfig())):
        if key.rpartition(".")[2] not in tabled:
            yield f"docs/operations.md: no config table row for the key `{key}`"
    yield from missing("docs/operations.md", "metric", metrics, operations, r"(_total)?")
    yield from check_architecture(ARCHITECTURE.read_text(encoding="utf-8"), tracked)
    for path in sorted(referring(tracked)):
        yield from check_heading_refs(path, (ROOT / path).read_text(encoding="utf-8"))
    for path in sorted(modules(tracked)):
        if not has_docstring((ROOT / path).read_text(encoding="utf-8"), path):
            yield f"{path}: no docstring saying what the module holds"


def check_text(where: str, text: str, tracked: set[str]) -> Iterator[str]:
    """What one document names that does not exist."""
    flags, _ = cli_flags()
    keys = config_key_names()
    metrics = metric_names()
    for span, fenced in spans(text):
        yield from (
            f"{where}: no such file `{p}`"
            for p in paths(span)
            if p not in tracked and p not in EXTERNAL and not bare_exists(p, tracked)
        )
        yield from (
            f"{where}: no such CLI flag `{f}`" for f in span_flags(span, fenced) if f not in flags
        )
    for key in documented_keys(text):
        if key not in keys:
            yield f"{where}: no such config key `{key}`"
    for name in METRIC.findall(text):
        if not metric_exists(name, metrics):
            yield f"{where}: no such metric `{name}`"


def missing(
    doc: str, what: str, names: Iterable[str], text: str, suffix: str = ""
) -> Iterator[str]:
    for name in sorted(names):
        if not re.search(rf"(?<![\w-]){re.escape(name)}{suffix}(?![\w-])", text):
            yield f"{doc}: does not mention the {what} `{name}`"


# -- what the docs say -------------------------------------------------------------------


def spans(text: str) -> Iterator[tuple[str, bool]]:
    """Inline code, and each line of fenced code (toml blocks are read for keys instead),
    with whether it was fenced."""
    for match in FENCE.finditer(text):
        if match.group(1) != "toml":
            lines = match.group(2).splitlines()
            yield from ((line.strip(), True) for line in lines if line.strip())
    outside = FENCE.sub("", text)
    yield from ((span, False) for span in CODE.findall(outside))


def paths(span: str) -> Iterator[str]:
    for word in span.split():
        word = word.strip("'\",;:()[]")
        if any(mark in word for mark in "<>*{}$=") or "..." in word or "://" in word:
            continue
        if word.startswith(NOT_IN_TREE) or word.startswith("-"):
            continue
        if (re.fullmatch(r"[\w./-]*\w\.\w+", word) and word.endswith(EXTENSIONS)) or (
            word.endswith("/") and "/" in word[:-1]
        ):
            yield word.rstrip("/")


def span_flags(span: str, fenced: bool) -> list[str]:
    """Flags of a `dsh-system-prompt ...` line, or of inline code that starts with one."""
    words = span.split()
    if not words:
        return []
    command = words[0].rsplit("/", 1)[-1]
    if command == "dsh-system-prompt" or (words[0].startswith("--") and not fenced):
        return FLAG.findall(span.split("#")[0])
    return []


def documented_keys(text: str) -> Iterator[str]:
    """First-column keys of config tables (a table whose header starts `| key |`) and the
    keys of ```toml blocks."""
    for table in re.finditer(r"^\| key \|.*?\n((?:\|.*\n)+)", text, re.M):
        for row in table.group(1).splitlines()[1:]:
            first = row.split("|")[1]
            for key in CODE.findall(first):
                if not key.startswith("["):  # a `[limits]` table heading
                    yield key
    for match in FENCE.finditer(text):
        if match.group(1) == "toml":
            for line in match.group(2).splitlines():
                found = re.match(r"\s*([a-z_]+)\s*=", line)
                if found:
                    yield found.group(1)


# -- the sources of truth ----------------------------------------------------------------


def tracked_files() -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    files = {line for line in listed if line}
    folders = {str(Path(f).parent.as_posix()) for f in files}
    parents = {p.as_posix() for f in files for p in Path(f).parents}
    return files | folders | parents


def bare_exists(path: str, tracked: set[str]) -> bool:
    """A name without a folder (`service.py`, `registry/`) is somewhere in the tree."""
    return any(f == path or f.endswith("/" + path) for f in tracked)


def cli_flags() -> tuple[set[str], set[str]]:
    """Every flag of every command (the CLI's and the bench scripts'), and those of `serve`."""
    root = build_parser()
    flags = {f for action in root._actions for f in action.option_strings}
    for script in (ROOT / "bench").glob("*.py"):
        flags |= set(ADD_ARGUMENT.findall(script.read_text(encoding="utf-8")))
    serve: set[str] = set()
    for name, sub in _commands(root):
        options = {f for a in sub._actions for f in a.option_strings}
        flags |= options
        if name == "serve":
            serve = {f for f in options if f.startswith("--") and f != "--help"}
    return flags, serve


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each command's name and parser, those of a command's own commands (`rules check`) too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _commands(sub)


def config_key_names() -> set[str]:
    """The config file's keys, `limits.x` also as plain `x` (the `[limits]` table's rows, and
    so on), and the keys of a `[[credentials]]` and a `[[rules]]` table."""
    keys = set(flat(SidecarConfig()))
    return keys | {key.rpartition(".")[2] for key in keys} | CREDENTIAL_KEYS | RULE_KEYS


def metric_names() -> set[str]:
    return {family.name for family in Metrics().registry.collect()}


def metric_exists(name: str, metrics: set[str]) -> bool:
    if name.endswith("*"):
        return any(metric.startswith(name[:-1]) for metric in metrics)
    base = re.sub(r"_(total|bucket|count|sum|created)$", "", name)
    return name in metrics or base in metrics


def referring(tracked: set[str]) -> set[str]:
    """The files whose references to sections are checked: every tracked text file but
    generated code and the dependencies'."""
    return {
        f
        for f in tracked
        if f.endswith(REFERRING)
        and (ROOT / f).is_file()
        and "/gen/" not in f
        and "node_modules/" not in f
        and not f.startswith("client/dsh/")  # the generated Python stubs
        and f not in GENERATED
        and f not in SPEAKS_OF_REFERENCES
    }


def check_heading_refs(where: str, text: str) -> Iterator[str]:
    """Each `docs/x.md, "Heading"` in text names a heading of docs/x.md."""
    for doc, heading in heading_refs(text):
        target = ROOT / doc
        if not target.is_file():
            yield f"{where}: no such document `{doc}`"
        elif heading not in headings(target.read_text(encoding="utf-8")):
            yield f'{where}: no heading "{heading}" in `{doc}`'


def heading_refs(text: str) -> Iterator[tuple[str, str]]:
    """The (document, heading) pairs text refers to, a reference broken over lines (of a
    comment too) read as one line."""
    joined = COMMENT_BREAK.sub(" ", text)
    for match in HEADING_REF.finditer(joined):
        yield match.group(1), match.group(2)
        for more in re.findall(QUOTED, match.group(3)):
            yield match.group(1), more


def headings(markdown: str) -> set[str]:
    """A document's headings as references name them: `### Part slots (feature
    `part-slots`)` is "Part slots (feature `part-slots`)" and "Part slots"; backticks may be
    left out."""
    names: set[str] = set()
    for line in FENCE.sub("", markdown).splitlines():
        found = re.match(r"#{1,6}\s+(.+?)\s*#*$", line)
        if found:
            title = found.group(1)
            for name in (title, re.sub(r"\s*\([^()]*\)$", "", title)):
                names |= {name, name.replace("`", "")}
    return names


def check_architecture(text: str, tracked: set[str]) -> Iterator[str]:
    """A line for every folder of the code, none for another, each short."""
    rows = {m.group(1): line for line in text.splitlines() if (m := FOLDER_ROW.match(line))}
    wanted = code_folders(tracked)
    for folder in sorted(wanted - rows.keys()):
        yield f"docs/architecture.md: no line for the folder `{folder}`"
    for folder, line in sorted(rows.items()):
        if folder not in wanted:
            yield f"docs/architecture.md: a line for `{folder}`, no folder of the code"
        elif len(line) > MAX_ROW:
            yield (
                f"docs/architecture.md: the line for `{folder}` has {len(line)} characters"
                f" (at most {MAX_ROW}: what a module holds goes in its docstring)"
            )


def code_folders(tracked: set[str]) -> set[str]:
    """The folders architecture.md gives a line each, as it names them: the Python packages'
    (the sidecar's as `server/.../x/`), the other clients' sources and the proto."""
    packages = {
        f.removesuffix("__init__.py")
        for f in tracked
        if f.endswith("/__init__.py") and f.startswith((*PACKAGES, SERVER))
    }
    named = {
        "server/.../" + folder.removeprefix(SERVER)
        if folder.startswith(SERVER) and folder != SERVER
        else folder
        for folder in packages
    }
    return named | {"proto/", *SOURCES}


def modules(tracked: set[str]) -> set[str]:
    """Every module of the Python packages and the other clients' sources, generated code and
    tests left out."""
    return {
        f
        for f in tracked
        if (
            (f.startswith((*PACKAGES, SERVER)) and f.endswith(".py"))
            or (f.startswith(SOURCES) and f.endswith((".ts", ".go")))
        )
        and "/gen/" not in f
        and not f.endswith("_test.go")
    }


def has_docstring(source: str, path: str) -> bool:
    """Whether a module opens by saying what it holds: a docstring, or a head comment."""
    if path.endswith(".py"):
        return bool(ast.get_docstring(ast.parse(source)))
    return source.lstrip().startswith(("//", "/*"))


if __name__ == "__main__":
    sys.exit(main())
