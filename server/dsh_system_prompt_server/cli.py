"""`dsh-system-prompt`: the sidecar's command line."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from .app import start_sidecar
from .config import ConfigError, SidecarConfig, load_config

DEFAULT_LISTEN = "127.0.0.1:50051"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    _parser().print_help()
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsh-system-prompt", description="The dsh-system-prompt registry as a gRPC sidecar."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the sidecar")
    serve.add_argument("--config", help="TOML config file (defaults apply without one)")
    serve.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help=f"HOST:PORT (port 0 picks a free one) or unix:PATH (default {DEFAULT_LISTEN})",
    )
    return parser


def _serve(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"dsh-system-prompt: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(config, args.listen))
    except OSError as error:
        print(f"dsh-system-prompt: cannot listen on {args.listen}: {error}", file=sys.stderr)
        return 1
    return 0


async def _run(config: SidecarConfig, listen: str) -> None:
    try:
        sidecar = await start_sidecar(config, listen)
    except RuntimeError as error:
        raise OSError(str(error)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"dsh-system-prompt listening on {sidecar.address}", flush=True)
    await stop.wait()
    print("dsh-system-prompt draining", flush=True)
    await sidecar.drain()
