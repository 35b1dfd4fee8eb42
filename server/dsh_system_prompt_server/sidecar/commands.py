"""The CLI's commands for people and scripts: assemble, watch, render, health, cache-history.

Output is plain text when piped and styled with rich on a terminal. Errors are
one line on stderr; exit codes: 0 ok, 1 the sidecar refused (or rendering
failed), 2 bad usage or input, 3 the sidecar is unreachable or not serving.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.markup import escape
from rich.table import Table

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class CommandError(Exception):
    """A one-line failure and the exit code it means."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """--address and the auth/TLS options every client command takes."""
    parser.add_argument(
        "--address",
        default=None,
        help=f"sidecar HOST:PORT or unix:PATH (default: $DSP_ADDRESS, else {dsp.DEFAULT_ADDRESS})",
    )
    parser.add_argument("--auth-token-file", help="send the bearer token in this file")
    parser.add_argument("--tls-ca", help="CA certificate (PEM) to trust: switches TLS on")
    parser.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", help="client private key (PEM) for mutual TLS")
    parser.add_argument("--tls-server-name", help="name the server certificate carries")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")


def run(command: str, args: argparse.Namespace) -> int:
    """Run one client command; returns the exit code."""
    try:
        if command == "render":
            return render(args)
        args.address = args.address or dsp.default_address()
        return asyncio.run(_COMMANDS[command](args))
    except CommandError as error:
        print(f"dsh-system-prompt {command}: {error}", file=sys.stderr)
        return error.code
    except dsp.SystemPromptError as error:
        code = EXIT_UNAVAILABLE if error.code in _UNREACHABLE else EXIT_REFUSED
        print(f"dsh-system-prompt {command}: {error}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return EXIT_OK


async def assemble(args: argparse.Namespace) -> int:
    fields = dict(_field(item) for item in args.field or ())
    report = dict(report=args.report, report_key=args.report_key, prefix_layout=args.prefix_layout)
    async with _connect(args) as client:
        if args.json:
            assembly = await client.assemble(args.scope, fields, timeout=args.timeout, **report)
            shown = assembly_json(assembly)
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
    return EXIT_OK


async def cache_history(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        history = await client.cache_history(args.scope, report_key=args.key)
    if args.json:
        print(json.dumps(dataclasses.asdict(history), ensure_ascii=False, indent=2))
        return EXIT_OK
    _show_history(history)
    return EXIT_OK


async def watch(args: argparse.Namespace) -> int:
    if args.prompt:
        return await watch_prompt(args)
    async with _connect(args) as client:
        changes = await client.watch_changes(
            args.scope, ancestors=args.ancestors, kinds=args.kind or None
        )
        console = _console()
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
    async with _connect(args) as client:
        prompts = await client.watch_prompt(args.scope, render=True)
        console = _console() if sys.stdout.isatty() else Console(width=200, no_color=True)
        async for change in prompts:
            if args.json:
                print(json.dumps(_prompt_json(change), ensure_ascii=False), flush=True)
                continue
            for line in _prompt_text(change):
                console.print(line, highlight=False, markup=False)
    return EXIT_OK


async def list_registrations(args: argparse.Namespace) -> int:
    async with _connect(args) as client:
        snapshot = await client.snapshot(
            args.scope, ancestors=args.ancestors, kinds=args.kind or None, values=args.values
        )
    if args.json:
        shown = dataclasses.asdict(snapshot)
        print(json.dumps(shown, ensure_ascii=False, indent=2, default=_tool_json))
        return EXIT_OK
    table = Table(title=f"registrations at revision {snapshot.revision}", title_justify="left")
    for column in ("kind", "name", "scope", "order", "value", "bytes", "fingerprint", "owner"):
        table.add_column(column, justify="right" if column in ("order", "bytes") else "left")
    for info in snapshot.registrations:
        table.add_row(
            info.kind,
            info.name,
            info.scope or "(global)",
            "" if info.order is None else f"{info.order:g}",
            _value_kind(info),
            str(info.size_bytes),
            info.fingerprint,
            f"{info.owner} [{info.owner_label}]",
        )
    console = _console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    console.print(table, markup=False)
    return EXIT_OK


def render(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}", EXIT_USAGE) from None
    except ValueError as error:
        raise CommandError(f"{path} is not valid JSON: {error}", EXIT_USAGE) from None
    assembly = assembly_from_json(raw)
    _show_prompt(dsp.render_prompt(assembly), dsp.render_context_snapshot(assembly), assembly, args)
    return EXIT_OK


async def health(args: argparse.Namespace) -> int:
    channel = dsp.open_channel(args.address, _tls(args))  # the client's own channel set-up
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=args.service)
        try:
            reply = await stub.Check(request, timeout=args.timeout, wait_for_ready=False)
        except grpc.aio.AioRpcError as error:
            raise CommandError(
                f"{args.address}: {error.code().name}: {error.details()}", EXIT_UNAVAILABLE
            ) from None
    finally:
        await channel.close()
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(status)
    return EXIT_OK if reply.status == health_pb2.HealthCheckResponse.SERVING else EXIT_UNAVAILABLE


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


def _not_an_assembly() -> CommandError:
    return CommandError(
        "an assembly file is a JSON object with sections and contexts ([{name, text}]),"
        " tools and variables ({name: text or null}), as `assemble --json` prints",
        EXIT_USAGE,
    )


_COMMANDS = {
    "assemble": assemble,
    "watch": watch,
    "health": health,
    "cache-history": cache_history,
    "ls": list_registrations,
}


def _connect(args: argparse.Namespace) -> Any:
    token = _read(args.auth_token_file).decode().strip() if args.auth_token_file else None
    return dsp.connect(
        args.address, client_name="dsh-system-prompt-cli", token=token, tls=_tls(args)
    )


def _tls(args: argparse.Namespace) -> dsp.TLS | None:
    if not (args.tls_ca or args.tls_cert):
        return None
    return dsp.TLS(
        root_certificates=_read(args.tls_ca) if args.tls_ca else None,
        private_key=_read(args.tls_key) if args.tls_key else None,
        certificate_chain=_read(args.tls_cert) if args.tls_cert else None,
        server_name=args.tls_server_name,
    )


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {path}: {error.strerror}", EXIT_USAGE) from None


def _field(item: str) -> tuple[str, Any]:
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise CommandError(f"--field takes key=value, not {item!r}", EXIT_USAGE)
    try:
        return key, json.loads(value)  # numbers, booleans, objects as JSON
    except ValueError:
        return key, value  # anything else is a string


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _show_prompt(
    prompt: str, snapshot: str, assembly: dsp.PromptAssembly, args: argparse.Namespace
) -> None:
    if not sys.stdout.isatty():
        print(prompt)
        if args.with_context and snapshot:
            print()
            print(snapshot)
        return
    console = _console()
    summary = Table.grid(padding=(0, 2))
    summary.add_row(
        f"[bold]{len(assembly.sections)}[/] sections",
        f"[bold]{len(assembly.contexts)}[/] contexts",
        f"[bold]{len(assembly.tools)}[/] tools: " + ", ".join(t.name for t in assembly.tools),
    )
    console.print(summary)
    console.rule("system prompt")
    console.print(prompt, markup=False)
    if args.with_context and snapshot:
        console.rule("runtime context")
        console.print(snapshot, markup=False)


def _show_report(report: dsp.AssemblyReport) -> int:
    """A table: part, source, size, stable/changed; then the prefix verdict, the diff and,
    when the assembly does not render, why (exit EXIT_REFUSED: the pod's renders fail)."""
    unit = f"tokens ({report.tokenizer})" if report.tokenizer else None
    title = f"prompt parts in model order ({report.prefix_layout})"
    table = Table(title=title, title_justify="left")
    for column in ("part", "source", "bytes", *([unit] if unit else []), "prefix"):
        table.add_column(column, justify="right" if column in ("bytes", unit) else "left")
    for part in report.parts:
        cells = [f'{part.kind} "{part.name}"', part.source.description, str(part.bytes)]
        if unit:
            cells.append(str(part.tokens))
        cells.append(_part_state(part, report.stability.has_previous))
        table.add_row(*cells)
    console = _console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    console.print(table)
    for line in _verdict(report):
        console.print(line, highlight=False, markup=False)
    if report.stability.diff:
        console.print(report.stability.diff, highlight=False, markup=False)
    if report.render_error:
        console.print(f"[bold red]render fails:[/] {escape(report.render_error)}")
        return EXIT_REFUSED
    return EXIT_OK


def _part_state(part: dsp.PartReport, compared: bool) -> str:
    if not compared:
        return "new" + (" (not in prefix)" if part.kind == "context" else "")
    state = "stable" if part.stable else "[bold red]changed[/]"
    return state + (" (not in prefix)" if part.kind == "context" else "")


def _verdict(report: dsp.AssemblyReport) -> list[str]:
    stability = report.stability
    total = stability.prefix
    sizes = f"{total.bytes} bytes" + (
        f", {total.tokens} tokens" if total.tokens is not None else ""
    )
    if not report.tokenizer:
        sizes += " (bytes only: no tokenizer configured)"
    key = report.history_key
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
        f"prefix: {stable}; cache broken by {stability.reason}",
        f"cost: {cost} recomputed, and every message after the prefix",
    ]


def _show_history(history: dsp.CacheHistory) -> None:
    """The key's counts and breakers, then its recent reports in a table."""
    console = _console() if sys.stdout.isatty() else Console(width=200, no_color=True)
    if not history.reports:
        gone = " (its earlier history was evicted)" if history.evicted else ""
        console.print(f"{history.key}: no reported assemblies{gone}", highlight=False)
        return
    unit = "tokens" if history.recomputed.tokens is not None else "bytes"
    total = history.recomputed.tokens if unit == "tokens" else history.recomputed.bytes
    console.print(
        f"{history.key}: {history.reports} reported, {history.breaks} broke the prefix;"
        f" {total} prefix {unit} recomputed in total",
        highlight=False,
        markup=False,
    )
    for part, count in history.breakers:
        breaks = f"{count} break" + ("" if count == 1 else "s")
        console.print(f"  {part}: {breaks}", highlight=False, markup=False)
    table = Table(title="recent reports, oldest first", title_justify="left")
    columns = ["#", "rev", "first changed", "reason", f"stable {unit}", f"recomputed {unit}"]
    for column in [*columns, "observed cached"]:
        left = column in ("first changed", "reason")
        table.add_column(column, justify="left" if left else "right")
    for entry in history.recent:
        stable = entry.stable_tokens if unit == "tokens" else entry.stable_bytes
        recomputed = entry.recomputed.tokens if unit == "tokens" else entry.recomputed.bytes
        table.add_row(
            str(entry.sequence),
            str(entry.revision),
            entry.first_changed or ("—" if entry.has_previous else "(first)"),
            entry.reason,
            str(stable),
            str(recomputed),
            "" if entry.observed_cached_tokens is None else str(entry.observed_cached_tokens),
        )
    console.print(table)


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
    return f"r{event.revision} {event.action} {event.kind}{name} ({where})"


def _value_kind(info: dsp.RegistrationInfo) -> str:
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
        return [*lines, f"does not assemble: {change.error}"]
    if change.prompt is not None:
        lines.append(change.prompt)
    if change.report is not None:
        lines.extend(_verdict(change.report))
        if change.report.stability.diff:
            lines.append(change.report.stability.diff)
        if change.report.render_error:
            lines.append(f"render fails: {change.report.render_error}")
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
