"""Go figures: a program of the Go client (clients/go/bench/), built by `make bench`
into .gopath/bin/go-bench, run as a child process, printing one JSON object."""

from __future__ import annotations

from typing import Any

from .node import run_command_json
from .procs import ROOT

GO_BENCH = ROOT / ".gopath" / "bin" / "go-bench"
_SETUP = "run `make go-bench` (Debian's Go toolchain; it builds clients/go/bench) first"


async def run_json(*args: str) -> dict[str, Any]:
    """Run the Go bench program with `args`; the JSON object it printed."""
    if not GO_BENCH.is_file():
        raise RuntimeError(f"{GO_BENCH} is missing: {_SETUP}")
    return await run_command_json([str(GO_BENCH), *args], ROOT, GO_BENCH.name)
