"""`dsh-system-prompt`: the sidecar's command line, its parser and `serve`; the client
commands run in `commands.py`, imported only when one runs (the client library and rich
are no part of `serve`)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from collections.abc import Sequence
from typing import Any

from dsh_system_prompt_core import package_version

from ..config import ConfigError, add_flags, flag_values
from ..reports import Layout
from ..telemetry import configure_logging, logger, tracing_from_env
from ..wire import AddressError, check_listen
from .app import start_sidecar
from .config import POLL_S, SidecarConfig, load_config, with_overrides

DEFAULT_LISTEN = "127.0.0.1:50051"  # where clients look by default too (dsp.DEFAULT_ADDRESS)
EXIT_CONFIG = 2
EXIT_LISTEN = 1
_log = logger("cli")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.run(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsh-system-prompt", description="The dsh-system-prompt registry as a gRPC sidecar."
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the sidecar")
    serve.set_defaults(run=_serve)
    serve.add_argument(
        "--config",
        help="TOML config file (defaults apply without one); reloaded on SIGHUP and on change",
    )
    serve.add_argument(
        "--config-poll",
        type=float,
        default=POLL_S,
        metavar="SECONDS",
        help=f"how often to look for a changed config file (default {POLL_S:g}; 0: SIGHUP only)",
    )
    serve.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        type=_listen_address,
        help=f"HOST:PORT (port 0 picks a free one) or unix:PATH (default {DEFAULT_LISTEN})",
    )
    add_flags(serve, SidecarConfig)  # the config keys a flag sets too
    _add_client_commands(commands)
    return parser


class _Version(argparse.Action):
    """--version: the installed version, read only when asked (argparse's own action reads
    it when the parser is built, on every start)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"{parser.prog} {package_version()}")  # on stdout, as argparse's own
        parser.exit()


def _add_client_commands(commands: Any) -> None:
    assemble = commands.add_parser("assemble", help="print the rendered prompt (or --json)")
    assemble.add_argument("--scope", help="the scope (agent) to assemble for")
    assemble.add_argument(
        "--field", action="append", metavar="KEY=VALUE", help="an assemble field (repeatable)"
    )
    assemble.add_argument("--json", action="store_true", help="print the assembly as JSON")
    assemble.add_argument(
        "--with-context", action="store_true", help="also print the runtime-context snapshot"
    )
    assemble.add_argument(
        "--report",
        action="store_true",
        help="show parts, sources, sizes and what changed since the last report (cache health)",
    )
    assemble.add_argument(
        "--report-key", help="compare and count the report under this key (default: the scope)"
    )
    assemble.add_argument(
        "--prefix-layout",
        choices=[layout.value for layout in Layout],
        help="the model server's prefix order for the report (default: the sidecar's)",
    )
    history = commands.add_parser(
        "cache-history", help="how often reports broke the prompt prefix, and which parts did"
    )
    which = history.add_mutually_exclusive_group()
    which.add_argument("--scope", help="the scope's history (default: the global scope)")
    which.add_argument("--key", help="the history of a report key named in assemblies")
    history.add_argument("--json", action="store_true", help="print the history as JSON")
    watch = commands.add_parser(
        "watch", help="print change events as they happen (or, with --prompt, a scope's prompt)"
    )
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.add_argument(
        "--prompt",
        action="store_true",
        help="show the scope's prompt at each change, with the prompt-cache verdict",
    )
    listing = commands.add_parser("ls", help="list the registrations (kind, name, owner, size)")
    listing.add_argument("--json", action="store_true", help="print the listing as JSON")
    listing.add_argument("--values", action="store_true", help="include the static values")
    for parser in (watch, listing):
        parser.add_argument("--scope", help="only this scope's layer (or its prompt)")
        parser.add_argument(
            "--ancestors", action="store_true", help="with --scope: also its ancestors and global"
        )
        parser.add_argument("--kind", action="append", choices=_KINDS, help="only this kind")
    render = commands.add_parser("render", help="render an assembly JSON file locally")
    render.add_argument("file", help="a file as `assemble --json` prints it")
    render.add_argument(
        "--with-context", action="store_true", help="also print the runtime-context snapshot"
    )
    _add_rule_commands(commands)
    health = commands.add_parser("health", help="check the sidecar's gRPC health (exit 0: SERVING)")
    health.add_argument("--service", default="", help="service name (default: the whole server)")
    for name, parser in (
        ("assemble", assemble),
        ("watch", watch),
        ("health", health),
        ("cache-history", history),
        ("ls", listing),
    ):
        add_connection_options(parser)
        parser.set_defaults(run=lambda args, name=name: _client_command(name, args))
    render.set_defaults(run=lambda args: _client_command("render", args))


def _add_rule_commands(commands: Any) -> None:
    """`rules check` and `rules test`: a rules file compiled and tried offline."""
    rules = commands.add_parser(
        "rules", help="compile a rules file, or try it on an assembly (offline, no sidecar)"
    )
    which = rules.add_subparsers(dest="rules_command", required=True)
    check = which.add_parser(
        "check", help="compile the file's [[rules]] as the sidecar does (exit 1: one is bad)"
    )
    test = which.add_parser(
        "test", help="apply the file's [[rules]] to an assembly and say what each changed"
    )
    for parser in (check, test):
        parser.add_argument("file", help="a TOML file of [[rules]] tables (or a config file)")
    test.add_argument(
        "--assembly", required=True, help="the assembly, as `assemble --json` prints it"
    )
    test.add_argument(
        "--field", action="append", metavar="KEY=VALUE", help="an assemble field (repeatable)"
    )
    test.add_argument(
        "--scope",
        action="append",
        metavar="KEY",
        help="the assembly's scope, then each ancestor (repeatable; default: global)",
    )
    test.add_argument("--json", action="store_true", help="print the outcome as JSON")
    check.set_defaults(run=lambda args: _client_command("rules check", args))
    test.set_defaults(run=lambda args: _client_command("rules test", args))


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """--address and the auth/TLS options every client command takes."""
    parser.add_argument(
        "--address",
        default=None,
        help=f"sidecar HOST:PORT or unix:PATH (default: $DSP_ADDRESS, else {DEFAULT_LISTEN})",
    )
    parser.add_argument("--auth-token-file", help="send the bearer token in this file")
    parser.add_argument("--tls-ca", help="CA certificate (PEM) to trust: switches TLS on")
    parser.add_argument("--tls-cert", help="client certificate (PEM) for mutual TLS")
    parser.add_argument("--tls-key", help="client private key (PEM) for mutual TLS")
    parser.add_argument("--tls-server-name", help="name the server certificate carries")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")


def _client_command(name: str, args: argparse.Namespace) -> int:
    from .commands import run  # the client library and rich load here, for client commands

    return run(name, args)


# The client's ChangeKind words (dsh_system_prompt/types.py), named here without loading it.
_KINDS = tuple(
    ["section", "context", "tools", "variable", "suppressor", "listener", "rule", "scope", "config"]
)


def _serve(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as error:
        print(f"dsh-system-prompt: {error}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.log_level, config.log_format)
    try:
        asyncio.run(_run(config, args))
    except OSError as error:
        print(f"dsh-system-prompt: cannot serve on {args.listen}: {error}", file=sys.stderr)
        return EXIT_LISTEN
    except (ConfigError, ValueError) as error:  # e.g. a metrics port in use, no tokenizer
        print(f"dsh-system-prompt: {error}", file=sys.stderr)
        return EXIT_CONFIG
    return 0


def _load(args: argparse.Namespace) -> SidecarConfig:
    """The config file with the command's flags over it (at start, and at every reload)."""
    return with_overrides(load_config(args.config), flag_values(args, SidecarConfig))


def _listen_address(value: str) -> str:
    try:
        check_listen(value)
    except AddressError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def _freeze_what_starting_made() -> None:
    """Move what starting made (modules, classes, protobuf descriptors, gRPC's objects: some
    34,000 tracked objects) out of every later garbage collection, as CPython's gc.freeze is
    meant for: they live as long as the process, and a full collection, which stops the
    loop, walked them all each time (the hostile soak's sidecar held 110,000-150,000; its
    full collections took 106-495 ms on a loaded host, calm or not, about its p99). Its
    garbage is collected first, so that none of it is kept for good."""
    gc.collect()
    gc.freeze()


async def _run(config: SidecarConfig, args: argparse.Namespace) -> None:
    sidecar = await start_sidecar(config, args.listen, tracing_from_env())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watching = None
    if args.config:
        from .reload import Reloader  # only a config file is reloaded

        reloader = Reloader(sidecar, args.config, lambda: _load(args))
        loop.add_signal_handler(signal.SIGHUP, reloader.reload, "SIGHUP")
        if args.config_poll > 0:
            watching = asyncio.create_task(reloader.watch(args.config_poll))
    print(f"dsh-system-prompt listening on {sidecar.address}", flush=True)
    _freeze_what_starting_made()
    if sidecar.admin is not None:
        print(f"dsh-system-prompt admin page on {sidecar.admin.url}", flush=True)
    await stop.wait()
    if watching is not None:
        watching.cancel()
    _log.info("draining (grace %ss)", config.shutdown_grace_s)
    await sidecar.drain()
