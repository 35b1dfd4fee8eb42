"""`rules check FILE` and `rules test FILE --assembly ASSEMBLY.json`: a rules file (the config
file's `[[rules]]` tables, or a config file itself) compiled offline as the sidecar compiles it
at start, and applied to an assembly as `assemble --json` printed it, saying what each rule
changed. No sidecar is asked: the registry's own compilation and apply run here."""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_core import escape_controls

from ..config import ConfigError, names
from ..registry import (
    Assembly,
    FailurePolicy,
    Inputs,
    Limits,
    OperatorRule,
    Part,
    RegistryError,
    RegistrySettings,
    Tool,
    apply,
    read_rules,
)
from .command_io import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, CommandError
from .prompt_commands import assembly_json, field_item, read_assembly

KEY = names(RegistrySettings).rules  # the config file's key: a rules file is its [[rules]] tables


def check(args: argparse.Namespace) -> int:
    rules = read_rules_file(args.file)
    names = ", ".join(f'"{rule.name}"' for rule in rules)
    print(escape_controls(f"{args.file}: {len(rules)} rule{_s(rules)} compile: {names}"))
    return EXIT_OK


def test(args: argparse.Namespace) -> int:
    rules = read_rules_file(args.file)
    fields = dict(field_item(item) for item in args.field or ())
    chain: list[str] = list(args.scope or ())
    current = _assembly(read_assembly(args.assembly))
    inputs = Inputs(
        fields_json=json.dumps(fields),
        scope=chain[0] if chain else "",
        chain=chain,
        limits=Limits(),
        orders={},  # the file has no orders: a new part goes after the parts it holds
    )
    outcomes: list[Outcome] = []
    running = in_run_order(rules, chain)
    for rule in running:
        try:
            after = apply(rule.compiled, current, inputs)
        except RegistryError as error:
            if rule.compiled.failure_policy is not FailurePolicy.IGNORE:
                raise CommandError(error.message, EXIT_REFUSED, lines=True) from None
            outcomes.append(Outcome(rule.name, "skipped", error=error.message))
            continue
        if after is current:
            outcomes.append(Outcome(rule.name, "not matched"))
            continue
        outcomes.append(Outcome(rule.name, "applied", changes(current, after)))
        current = after
    outcomes += [Outcome(r.name, "not for this scope") for r in rules if r not in running]
    result = assembly_json(_client_assembly(current))
    if args.json:
        shown = {KEY: [outcome.json() for outcome in outcomes], "assembly": result}  # as the file
        print(json.dumps(shown, ensure_ascii=False, indent=2))
        return EXIT_OK
    for outcome in outcomes:
        print(escape_controls(outcome.line()))
    print()
    print(json.dumps(result, ensure_ascii=False, indent=2))
    return EXIT_OK


def read_rules_file(file: str) -> tuple[OperatorRule, ...]:
    """The file's `[[rules]]`, each compiled; an unreadable file is a usage error, a bad rule
    a refusal naming the rule, the expression and CEL's message with its position."""
    path = Path(file)
    try:
        with path.open("rb") as opened:
            table = tomllib.load(opened)
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}", EXIT_USAGE) from None
    except tomllib.TOMLDecodeError as error:
        raise CommandError(f"{path} is not valid TOML: {error}", EXIT_USAGE) from None
    if KEY not in table:
        raise CommandError(f"{path} has no [[{KEY}]] tables", EXIT_USAGE)
    try:
        return read_rules(KEY, table[KEY])
    except ConfigError as error:
        raise CommandError(f"{path}: {error}", EXIT_REFUSED, lines=True) from None


def in_run_order(rules: tuple[OperatorRule, ...], chain: list[str]) -> list[OperatorRule]:
    """The rules an assembly on `chain` runs, in the sidecar's order for the config's rules
    (registry/callbacks/listener_index.py): the prepended ones first, the last prepended
    first, then the others as the file lists them; a rule with a scope pattern only where a
    key of the chain matches it."""
    runs = [
        rule
        for rule in rules
        if rule.pattern is None or any(fnmatchcase(key, rule.pattern) for key in chain)
    ]
    prepended = [rule for rule in runs if rule.prepend]
    return prepended[::-1] + [rule for rule in runs if not rule.prepend]


@dataclass(frozen=True)
class Outcome:
    """What one rule did: applied (with its changes), not matched, skipped (failed under
    IGNORE), or not run (its scope pattern matches no key of the chain)."""

    rule: str
    result: str
    changes: list[str] = field(default_factory=list)
    error: str = ""

    def line(self) -> str:
        head = f'rule "{self.rule}": '
        if self.result == "skipped":
            return f"{head}skipped (failure_policy ignore): {self.error}"
        if self.result == "not matched":
            return f"{head}a match expression is false: not applied"
        if self.result == "not for this scope":
            return f"{head}its scope pattern matches no key of the scope chain: not run"
        return head + ("; ".join(self.changes) or "applied, nothing changed")

    def json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"name": self.rule, "result": self.result}
        if self.result == "applied":
            shown["changes"] = self.changes
        if self.error:
            shown["error"] = self.error
        return shown


def changes(before: Assembly, after: Assembly) -> list[str]:
    """What a rule made of `before`, part by part: removed, added, changed, reordered."""
    said: list[str] = []
    for noun, old, new in (
        ("tool", [(t.name, t) for t in before.tools], [(t.name, t) for t in after.tools]),
        ("section", _named(before.sections), _named(after.sections)),
        ("context", _named(before.contexts), _named(after.contexts)),
    ):
        said.extend(_list_changes(noun, old, new))
    for name, value in after.variables.items():
        if name in before.variables and before.variables[name] == value:
            continue
        said.append(
            f'variable "{name}" unset' if value is None else f'variable "{name}" set to "{value}"'
        )
    return said


def _named(parts: list[Part]) -> list[tuple[str, Part]]:
    return [(part.name, part) for part in parts]


def _list_changes(noun: str, old: list[tuple[str, Any]], new: list[tuple[str, Any]]) -> list[str]:
    before, after = dict(old), dict(new)
    said = [f'{noun} "{name}" removed' for name, _ in old if name not in after]
    for name, value in new:
        if name not in before:
            said.append(f'{noun} "{name}" added')
        elif before[name] != value:
            said.append(f'{noun} "{name}" changed')
    kept_before = [name for name, _ in old if name in after]
    kept_after = [name for name, _ in new if name in before]
    if kept_before != kept_after:
        said.append(f"{noun}s reordered: " + ", ".join(kept_after))
    return said


def _assembly(assembly: dsp.PromptAssembly) -> Assembly:
    """The client's assembly as the registry's, as the sidecar would hand it to a rule."""
    return Assembly(
        sections=[Part(s.name, s.text) for s in assembly.sections],
        contexts=[Part(c.name, c.text) for c in assembly.contexts],
        tools=[
            Tool(t.name, t.description, json.dumps(t.parameters, separators=(",", ":")))
            for t in assembly.tools
        ],
        variables=dict(assembly.variables),
    )


def _client_assembly(assembly: Assembly) -> dsp.PromptAssembly:
    return dsp.PromptAssembly(
        sections=[dsp.AssembledSection(p.name, p.text) for p in assembly.sections],
        contexts=[dsp.AssembledContext(p.name, p.text) for p in assembly.contexts],
        tools=[
            dsp.ToolSchema(t.name, t.description, json.loads(t.parameters_json))
            for t in assembly.tools
        ],
        variables=dict(assembly.variables),
    )


def _s(items: tuple[Any, ...]) -> str:
    return "" if len(items) == 1 else "s"
