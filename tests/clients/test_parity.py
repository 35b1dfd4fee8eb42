"""docs/clients.md's table maps every public name of the Python client to its Go and
TypeScript counterparts: a Python name without a row fails, as does a row naming a Go or
TypeScript name the client does not export, or a cell that is neither names nor a reason."""

from __future__ import annotations

import re
from pathlib import Path

import dsh_system_prompt

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "clients.md"
GO = ROOT / "clients" / "go" / "dsp"
TYPESCRIPT = ROOT / "clients" / "typescript" / "src"
NAME = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
# A cell without a counterpart says why: not applicable to the language, or not there yet.
REASONED = re.compile(r"^(n/a|not yet): \S.*")


def rows(text: str) -> dict[str, tuple[str, str]]:
    """The table after `<!-- parity -->`: Python name -> (Go cell, TypeScript cell)."""
    table = text.split("<!-- parity -->\n", 1)[1].split("\n\n", 1)[0]
    found: dict[str, tuple[str, str]] = {}
    for line in table.splitlines()[2:]:
        python, go, typescript = (cell.strip() for cell in line.strip("|").split("|"))
        match = NAME.fullmatch(python)
        assert match is not None, f"not a Python name: {python!r}"
        assert match.group(1) not in found, f"two rows for {python}"
        found[match.group(1)] = (go, typescript)
    return found


def go_exports() -> set[str]:
    """The Go package's exported top-level names: functions, types, constants, variables."""
    names: set[str] = set()
    for path in GO.glob("*.go"):
        if path.name.endswith("_test.go"):
            continue
        source = path.read_text(encoding="utf-8")
        names |= set(re.findall(r"^func ([A-Z]\w*)", source, re.M))
        names |= set(re.findall(r"^(?:type|const|var) ([A-Z]\w*)", source, re.M))
        for block in re.findall(r"^(?:const|var|type) \((.*?)^\)", source, re.M | re.S):
            names |= set(re.findall(r"^\t([A-Z]\w*)", block, re.M))
    return names


def typescript_exports() -> set[str]:
    """What index.ts exports: its export lists, and every export of the modules it
    re-exports whole."""
    index = (TYPESCRIPT / "index.ts").read_text(encoding="utf-8")
    names: set[str] = set()
    for listed in re.findall(r"export (?:type )?\{(.*?)\}", index, re.S):
        names |= {word.split()[-1] for word in listed.split(",") if word.strip()}
    for module in re.findall(r'export \* from "\./(\w+)\.js"', index):
        source = (TYPESCRIPT / f"{module}.ts").read_text(encoding="utf-8")
        declared = r"^export (?:interface|type|const|class|function|enum) (\w+)"
        names |= set(re.findall(declared, source, re.M))
    return names


def problems(
    table: dict[str, tuple[str, str]], public: set[str], go: set[str], typescript: set[str]
) -> list[str]:
    found = [f"{name}: no row" for name in sorted(public - table.keys())]
    found += [f"{name}: a row, but no such Python public name" for name in table.keys() - public]
    for python, cells in sorted(table.items()):
        for language, cell, exported in (
            ("Go", cells[0], go),
            ("TypeScript", cells[1], typescript),
        ):
            if REASONED.match(cell):
                continue
            names = NAME.findall(cell)
            if not names or NAME.sub("", cell).strip(", ") != "":
                found.append(
                    f"{python}: the {language} cell is neither names nor a reason: {cell!r}"
                )
            found += [
                f"{python}: {language} exports no {name}" for name in names if name not in exported
            ]
    return found


def test_every_python_public_name_has_its_go_and_typescript_counterparts() -> None:
    table = rows(TABLE.read_text(encoding="utf-8"))
    go, typescript = go_exports(), typescript_exports()
    assert {"Connect", "Client", "ChangeKindSection", "Handle", "Registration"} <= go
    assert {"connect", "Client", "ChangeKind", "Disposer", "renderPrompt"} <= typescript
    assert problems(table, set(dsh_system_prompt.__all__), go, typescript) == []


def test_the_parity_check_fails_on_a_missing_row_or_a_name_not_exported() -> None:
    text = (
        "<!-- parity -->\n| Python | Go | TypeScript |\n|---|---|---|\n"
        "| `connect` | `Connect` | `connect` |\n"
        "| `Client` | `Client`, `Gone` | n/a |\n"
        "| `Scope` | scope it | not yet: soon |\n\n"
    )
    found = problems(
        rows(text),
        {"connect", "Client", "Scope", "render_prompt"},
        {"Connect", "Client"},
        {"connect"},
    )
    assert found == [
        "render_prompt: no row",
        "Client: Go exports no Gone",
        "Client: the TypeScript cell is neither names nor a reason: 'n/a'",
        "Scope: the Go cell is neither names nor a reason: 'scope it'",
    ]
