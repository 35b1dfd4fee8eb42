"""The CLI's commands for people and scripts: assemble, render, cache-history
(`prompt_commands.py`), watch, ls (`watch_commands.py`), rules check and rules test
(`rule_commands.py`, offline) and health (here).

Output is plain text when piped and styled with rich on a terminal. Errors are
one line on stderr; exit codes: 0 ok, 1 the sidecar refused (or rendering
failed), 2 bad usage or input, 3 the sidecar is unreachable or not serving.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import dsh_system_prompt as dsp
import grpc.aio
from dsh_system_prompt_core import escape_controls
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .command_io import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    UNREACHABLE,
    CommandError,
    escape_lines,
    tls_of,
)
from .prompt_commands import assemble, cache_history, render
from .watch_commands import list_registrations, watch


def run(command: str, args: argparse.Namespace) -> int:
    """Run one client command; returns the exit code."""
    try:
        if command == "render":
            return render(args)
        if command.startswith("rules "):  # offline: the registry's rules, no connection
            from .rule_commands import check, test

            return check(args) if command == "rules check" else test(args)
        args.address = args.address or dsp.default_address()
        return asyncio.run(_COMMANDS[command](args))
    except CommandError as error:  # it may quote the sidecar: its controls as escapes
        shown = escape_lines(str(error)) if error.lines else escape_controls(str(error))
        print(f"dsh-system-prompt {command}: {shown}", file=sys.stderr)
        return error.code
    except dsp.SystemPromptError as error:  # the sidecar's words, a client's message in them
        code = EXIT_UNAVAILABLE if error.code in UNREACHABLE else EXIT_REFUSED
        print(f"dsh-system-prompt {command}: {escape_controls(str(error))}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        return EXIT_OK


async def health(args: argparse.Namespace) -> int:
    channel = dsp.open_channel(args.address, tls_of(args))  # the client's own channel set-up
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


_COMMANDS = {
    "assemble": assemble,
    "watch": watch,
    "health": health,
    "cache-history": cache_history,
    "ls": list_registrations,
}
