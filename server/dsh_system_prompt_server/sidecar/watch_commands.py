"""watch and ls: the registrations as they change or as they stand, and a scope's prompt at
each change with its prompt-cache verdict."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_core import escape_controls
from google.protobuf import json_format
from rich.console import Console
from rich.table import Table

from .command_io import EXIT_OK, connect, escape_lines, styled_console
from .prompt_commands import verdict


async def watch(args: argparse.Namespace) -> int:
    if args.prompt:
        return await watch_prompt(args)
    async with connect(args) as client:
        changes = await client.watch_changes(
            args.scope, ancestors=args.ancestors, kinds=args.kind or None
        )
        console = styled_console()
        if not args.json:
            console.print(f"watching from revision {changes.revision}", style="dim")
        async for event in changes:
            if args.json:
                print(json.dumps(_event_json(event)), flush=True)
            else:
                console.print(_event_text(event), highlight=False, markup=False)
    return EXIT_OK


async def watch_prompt(args: argparse.Namespace) -> int:
    """The scope's prompt, then each change to it with its prompt-cache verdict."""
    async with connect(args) as client:
        prompts = await client.watch_prompt(args.scope, render=True)
        console = styled_console() if sys.stdout.isatty() else Console(width=200, no_color=True)
        async for change in prompts:
            if args.json:
                print(json.dumps(_prompt_json(change), ensure_ascii=False), flush=True)
                continue
            for line in _prompt_text(change):
                console.print(line, highlight=False, markup=False)
    return EXIT_OK


async def list_registrations(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        snapshot = await client.snapshot(
            args.scope, ancestors=args.ancestors, kinds=args.kind or None, values=args.values
        )
    if args.json:
        shown = dataclasses.asdict(snapshot)
        for info, listed in zip(snapshot.registrations, shown["registrations"], strict=True):
            if isinstance(info.value, dsp.Rule):
                listed["value"] = rule_table(info.value)
        print(json.dumps(shown, ensure_ascii=False, indent=2, default=_tool_json))
        return EXIT_OK
    table = Table(title=f"registrations at revision {snapshot.revision}", title_justify="left")
    for column in ("kind", "name", "scope", "order", "value", "bytes", "fingerprint", "owner"):
        table.add_column(column, justify="right" if column in ("order", "bytes") else "left")
    for info in snapshot.registrations:  # names are the clients': controls escaped
        table.add_row(
            info.kind,
            escape_controls(info.name),
            escape_controls(info.scope or "(global)"),
            "" if info.order is None else f"{info.order:g}",
            _value_kind(info),
            str(info.size_bytes),
            info.fingerprint,
            escape_controls(f"{info.owner} [{info.owner_label}]"),
        )
    console = styled_console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    console.print(table, markup=False)
    return EXIT_OK


def _event_json(event: dsp.ChangeEvent | dsp.ChangesMissed | dsp.ChangesResynced) -> dict[str, Any]:
    if isinstance(event, dsp.ChangesMissed):
        return {"missed": event.count, "resync_revision": event.resync_revision}
    if isinstance(event, dsp.ChangesResynced):
        return {
            "resynced": event.reason,
            "revision": event.snapshot.revision,
            "registrations": len(event.snapshot.registrations),
        }
    return {
        "revision": event.revision,
        "kind": event.kind,
        "action": event.action,
        "name": event.name,
        "scope": event.scope,
    }


def _event_text(event: dsp.ChangeEvent | dsp.ChangesMissed | dsp.ChangesResynced) -> str:
    if isinstance(event, dsp.ChangesMissed):
        return f"missed {event.count} events; resync at revision {event.resync_revision}"
    if isinstance(event, dsp.ChangesResynced):
        why = "the sidecar restarted" if event.reason == "restarted" else "fell behind"
        count = len(event.snapshot.registrations)
        return f"resynced ({why}): {count} registrations at revision {event.snapshot.revision}"
    where = f"scope {event.scope}" if event.scope else "global"
    name = f" {event.name}" if event.name else ""
    return escape_controls(f"r{event.revision} {event.action} {event.kind}{name} ({where})")


def rule_table(rule: dsp.Rule) -> dict[str, Any]:
    """A rule's definition in the shape of a config file's `[[rules]]` table (its name,
    scope and prepend aside): what `rules check` reads."""
    spec = json_format.MessageToDict(rule.to_proto(), preserving_proto_field_name=True)
    table: dict[str, Any] = {"match": list(rule.match)} if rule.match else {}
    if rule.variables:
        table["variables"] = dict(rule.variables)
    table["mutations"] = spec.get("mutations", [])
    table["failure_policy"] = rule.failure_policy.value
    return table


def _value_kind(info: dsp.RegistrationInfo) -> str:
    if info.kind == "rule":
        return "cel"  # run by the sidecar: neither a static value nor a callback
    if info.dynamic:
        return "dynamic"
    return "static" if info.fingerprint else ""


def _prompt_text(change: dsp.PromptChange) -> list[str]:
    """A change's header, what changed, the prompt and the cache verdict."""
    lines = [f"── revision {change.revision} " + "─" * 40]
    for event in change.changes:
        lines.append("changed: " + _event_text(event))
    if change.changes_omitted:
        lines.append(f"changed: {change.changes_omitted} more not listed")
    if change.error:
        return [*lines, f"does not assemble: {escape_controls(change.error)}"]
    if change.prompt is not None:  # for a person: its controls as escapes, as below
        lines.append(escape_lines(change.prompt))
    if change.report is not None:
        lines.extend(verdict(change.report))
        if change.report.stability.diff:
            lines.append(escape_lines(change.report.stability.diff))
        if change.report.render_error:
            lines.append(f"render fails: {escape_controls(change.report.render_error)}")
    return lines


def _prompt_json(change: dsp.PromptChange) -> dict[str, Any]:
    stability = change.report.stability if change.report is not None else None
    return {
        "revision": change.revision,
        "changes": [_event_json(event) for event in change.changes],
        "changes_omitted": change.changes_omitted,
        "prompt": change.prompt,
        "error": change.error,
        "cache": None if stability is None else dataclasses.asdict(stability),
    }


def _tool_json(value: object) -> object:
    # Tools inside listed values: their JSON shape, as `assemble --json` prints them.
    if isinstance(value, dsp.ToolSchema):
        return {
            "name": value.name,
            "description": value.description,
            "parameters": value.parameters,
        }
    raise TypeError(f"not JSON: {type(value).__name__}")
