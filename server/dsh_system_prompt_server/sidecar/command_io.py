"""What every client command shares: its exit codes, its one-line error, its connection,
the consoles it prints on and how it shows text a peer chose. Loaded only to run a client
command (the client library and rich with it), never by `serve`; the connection options
are parsed by `cli.py`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
from dsh_system_prompt_core import escape_controls
from rich.console import Console

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class CommandError(Exception):
    """A failure and the exit code it means: one line, unless `lines` (CEL's message under
    the expression it quotes, with a caret at the position)."""

    def __init__(self, message: str, code: int, lines: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.lines = lines


def connect(args: argparse.Namespace) -> Any:
    token = _read(args.auth_token_file).decode().strip() if args.auth_token_file else None
    return dsp.connect(
        args.address, client_name="dsh-system-prompt-cli", token=token, tls=tls_of(args)
    )


def tls_of(args: argparse.Namespace) -> dsp.TLS | None:
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


def styled_console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def escape_lines(text: str) -> str:
    """`text` of several lines (a diff) with the control characters of each escaped."""
    return "\n".join(escape_controls(line) for line in text.split("\n"))
