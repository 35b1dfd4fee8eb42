"""assemble, render and cache-history: a prompt as the sidecar assembles it (or a file holds
it), its report, and the prefix-cache history of its key."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_core import escape_controls
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .command_io import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CommandError,
    connect,
    escape_lines,
    styled_console,
)


async def assemble(args: argparse.Namespace) -> int:
    fields = dict(field_item(item) for item in args.field or ())
    report = dict(report=args.report, report_key=args.report_key, prefix_layout=args.prefix_layout)
    async with connect(args) as client:
        if args.json:
            assembly = await client.assemble(args.scope, fields, timeout=args.timeout, **report)
            shown = assembly_json(assembly)
            shown["skipped"] = [dataclasses.asdict(step) for step in assembly.skipped]
            if assembly.report is not None:
                shown["report"] = dataclasses.asdict(assembly.report)
            print(json.dumps(shown, ensure_ascii=False, indent=2))
            return EXIT_OK
        if args.report:  # no render asked: the report itself says whether one would fail
            reported = await client.assemble(args.scope, fields, timeout=args.timeout, **report)
            if reported.report is None:
                raise CommandError(
                    "the sidecar answered without the report asked for", EXIT_REFUSED
                )
            return _show_report(reported.report)
        rendered = await client.render(args.scope, fields, timeout=args.timeout)
    _show_prompt(rendered.prompt, rendered.context_snapshot, rendered.assembly, args)
    for step in rendered.skipped:  # stdout stays the prompt, for scripts that pipe it
        print(f"dsh-system-prompt assemble: {skipped_line(step)}", file=sys.stderr)
    return EXIT_OK


async def cache_history(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        history = await client.cache_history(args.scope, report_key=args.key)
    if args.json:
        print(json.dumps(dataclasses.asdict(history), ensure_ascii=False, indent=2))
        return EXIT_OK
    _show_history(history)
    return EXIT_OK


def render(args: argparse.Namespace) -> int:
    assembly = read_assembly(args.file)
    _show_prompt(dsp.render_prompt(assembly), dsp.render_context_snapshot(assembly), assembly, args)
    return EXIT_OK


def read_assembly(file: str) -> dsp.PromptAssembly:
    """The assembly a file holds, as `assemble --json` prints it; a usage error otherwise."""
    path = Path(file)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}", EXIT_USAGE) from None
    except ValueError as error:
        raise CommandError(f"{path} is not valid JSON: {error}", EXIT_USAGE) from None
    return assembly_from_json(raw)


def assembly_json(assembly: dsp.PromptAssembly) -> dict[str, Any]:
    """The assembly as plain JSON (the shape `render FILE.json` reads)."""
    return {
        "sections": [{"name": s.name, "text": s.text} for s in assembly.sections],
        "contexts": [{"name": c.name, "text": c.text} for c in assembly.contexts],
        "tools": [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in assembly.tools
        ],
        "variables": assembly.variables,
    }


def assembly_from_json(raw: object) -> dsp.PromptAssembly:
    """Read the shape `assemble --json` prints; tools are optional."""
    if not isinstance(raw, dict):
        raise _not_an_assembly()
    variables = raw.get("variables", {})
    if not isinstance(variables, dict) or not all(
        v is None or isinstance(v, str) for v in variables.values()
    ):
        raise _not_an_assembly()
    try:
        return dsp.PromptAssembly(
            sections=[
                dsp.AssembledSection(str(s["name"]), str(s["text"]))
                for s in raw.get("sections", [])
            ],
            contexts=[
                dsp.AssembledContext(str(c["name"]), str(c["text"]))
                for c in raw.get("contexts", [])
            ],
            tools=[
                dsp.ToolSchema(t["name"], t.get("description", ""), t.get("parameters", {}))
                for t in raw.get("tools", [])
            ],
            variables=variables,
        )
    except (KeyError, TypeError, AttributeError):
        raise _not_an_assembly() from None


def skipped_line(step: dsp.SkippedStep) -> str:
    """A step the assembly went on without: which callback, its reason, and the message the
    assembly would have failed with under FailurePolicy.FAIL, on one line: control
    characters shown as escapes (`\\n`, `\\x1b`), as the message is a client's."""
    where = "global" if step.scope is None else f'scope "{step.scope}"'
    name = f' "{step.name}"' if step.name else ""
    return escape_controls(f"skipped {step.kind}{name} ({where}): {step.reason}: {step.message}")


def _not_an_assembly() -> CommandError:
    return CommandError(
        "an assembly file is a JSON object with sections and contexts ([{name, text}]),"
        " tools and variables ({name: text or null}), as `assemble --json` prints",
        EXIT_USAGE,
    )


def field_item(item: str) -> tuple[str, Any]:
    """One `--field KEY=VALUE`: the value as JSON when it reads as JSON, else the string."""
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise CommandError(f"--field takes key=value, not {item!r}", EXIT_USAGE)
    try:
        return key, json.loads(value)  # numbers, booleans, objects as JSON
    except ValueError:
        return key, value  # anything else is a string


def _show_prompt(
    prompt: str, snapshot: str, assembly: dsp.PromptAssembly, args: argparse.Namespace
) -> None:
    if not sys.stdout.isatty():
        print(prompt)
        if args.with_context and snapshot:
            print()
            print(snapshot)
        return
    console = styled_console()
    summary = Table.grid(padding=(0, 2))
    names = ", ".join(escape(escape_controls(t.name)) for t in assembly.tools)
    summary.add_row(
        f"[bold]{len(assembly.sections)}[/] sections",
        f"[bold]{len(assembly.contexts)}[/] contexts",
        f"[bold]{len(assembly.tools)}[/] tools: " + names,
    )
    console.print(summary)
    console.rule("system prompt")  # a person reads it here: its controls as escapes
    console.print(escape_lines(prompt), markup=False)
    if args.with_context and snapshot:
        console.rule("runtime context")
        console.print(escape_lines(snapshot), markup=False)


def _show_report(report: dsp.AssemblyReport) -> int:
    """A table: part, source, size, stable/changed; then the prefix verdict, the steps the
    assembly skipped, the diff and, when the assembly does not render, why (exit
    EXIT_REFUSED: the pod's renders fail)."""
    unit = f"tokens ({report.tokenizer})" if report.tokenizer else None
    title = f"prompt parts in model order ({report.prefix_layout})"
    table = Table(title=title, title_justify="left")
    for column in ("part", "source", "bytes", *([unit] if unit else []), "prefix"):
        table.add_column(column, justify="right" if column in ("bytes", unit) else "left")
    for part in report.parts:  # names are the clients': no markup, controls escaped
        name = escape_controls(f'{part.kind} "{part.name}"')
        cells: list[str | Text] = [name, escape_controls(part.source.description)]
        cells.append(str(part.bytes))
        if unit:
            cells.append(str(part.tokens))
        cells.append(_part_state(part, report.stability.has_previous))
        table.add_row(*cells)
    console = styled_console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    console.print(table, markup=False)
    for line in verdict(report):
        console.print(line, highlight=False, markup=False)
    for step in report.skipped:  # one line each, however long its message
        console.print(skipped_line(step), highlight=False, markup=False, soft_wrap=True)
    if report.stability.diff:
        console.print(escape_lines(report.stability.diff), highlight=False, markup=False)
    if report.render_error:
        console.print(f"[bold red]render fails:[/] {escape(escape_controls(report.render_error))}")
        return EXIT_REFUSED
    return EXIT_OK


def _part_state(part: dsp.PartReport, compared: bool) -> Text:
    where = " (not in prefix)" if part.kind == "context" else ""
    if not compared:
        return Text("new" + where)
    if part.stable:
        return Text("stable" + where)
    return Text.assemble(("changed", "bold red"), where)


def verdict(report: dsp.AssemblyReport) -> list[str]:
    stability = report.stability
    total = stability.prefix
    sizes = f"{total.bytes} bytes" + (
        f", {total.tokens} tokens" if total.tokens is not None else ""
    )
    if not report.tokenizer:
        sizes += " (bytes only: no tokenizer configured)"
    key = escape_controls(report.history_key)  # a key, like the reason, names parts
    if stability.previous_evicted:
        return [
            f"prefix: {sizes}; the earlier reports of {key} were evicted to make room for"
            " other keys (raise report_keys): nothing to compare with"
        ]
    if not stability.has_previous:
        return [f"prefix: {sizes}; first report for {key}, nothing to compare with yet"]
    if not stability.reason:
        return [f"prefix: {sizes}; stable: every byte unchanged since the last report"]
    stable = f"{stability.stable_bytes} of {total.bytes} bytes stable"
    if stability.stable_tokens is not None:
        stable += f" ({stability.stable_tokens} tokens)"
    recomputed = stability.recomputed
    cost = f"{recomputed.bytes} prefix bytes"
    if recomputed.tokens is not None:
        cost = f"{recomputed.tokens} prefix tokens"
    return [
        f"prefix: {stable}; cache broken by {escape_controls(stability.reason)}",
        f"cost: {cost} recomputed, and every message after the prefix",
    ]


def _show_history(history: dsp.CacheHistory) -> None:
    """The key's counts and breakers, then its recent reports in a table (with the steps
    each skipped, when one did: often why its prefix broke)."""
    console = styled_console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    key = escape_controls(history.key)  # keys, parts and reasons name the clients' parts
    if not history.reports:
        gone = " (its earlier history was evicted)" if history.evicted else ""
        console.print(f"{key}: no reported assemblies{gone}", highlight=False, markup=False)
        return
    unit = "tokens" if history.recomputed.tokens is not None else "bytes"
    total = history.recomputed.tokens if unit == "tokens" else history.recomputed.bytes
    console.print(
        f"{key}: {history.reports} reported, {history.breaks} broke the prefix;"
        f" {total} prefix {unit} recomputed in total",
        highlight=False,
        markup=False,
    )
    for part, count in history.breakers:
        breaks = f"{count} break" + ("" if count == 1 else "s")
        console.print(f"  {escape_controls(part)}: {breaks}", highlight=False, markup=False)
    table = Table(title="recent reports, oldest first", title_justify="left")
    columns = ["#", "rev", "first changed", "reason", f"stable {unit}", f"recomputed {unit}"]
    skipping = any(entry.skipped_counts for entry in history.recent)
    for column in [*columns, "observed cached", *(["skipped"] if skipping else [])]:
        left = column in ("first changed", "reason", "skipped")
        table.add_column(column, justify="left" if left else "right")
    for entry in history.recent:
        stable = entry.stable_tokens if unit == "tokens" else entry.stable_bytes
        recomputed = entry.recomputed.tokens if unit == "tokens" else entry.recomputed.bytes
        table.add_row(
            str(entry.sequence),
            str(entry.revision),
            escape_controls(entry.first_changed) or ("—" if entry.has_previous else "(first)"),
            escape_controls(entry.reason),
            str(stable),
            str(recomputed),
            "" if entry.observed_cached_tokens is None else str(entry.observed_cached_tokens),
            *([_skipped_counts_text(entry.skipped_counts)] if skipping else []),
        )
    console.print(table, markup=False)


def _skipped_counts_text(counts: tuple[dsp.SkippedCount, ...]) -> str:
    """`2 section PROVIDER_TIMEOUT, 1 listener LISTENER_FAILED`, control characters as
    escapes: a reason this client does not know is the sidecar's text."""
    shown = ", ".join(f"{counted.count} {counted.kind} {counted.reason}" for counted in counts)
    return escape_controls(shown)
