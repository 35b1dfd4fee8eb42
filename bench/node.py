"""Node.js figures: a script of the TypeScript client (clients/typescript/bench/) run
as a child process, printing one JSON object that the figure reads."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

from .procs import ROOT

TS_CLIENT = ROOT / "clients" / "typescript"
TIMEOUT_S = 600.0
_SETUP = "run `make ts-build` (the TypeScript client, built into clients/typescript/dist) first"


async def run_json(script: Path, *args: str) -> dict[str, Any]:
    """Run `node script args...`; the JSON object it printed on its last line."""
    return await run_command_json([_node(script), str(script), *args], TS_CLIENT, script.name)


async def run_bench(script: str, address: str, iterations: int, warmup: int) -> dict[str, Any]:
    """Run the client's `dist/bench/<script>` against `address`; what it measured."""
    path = TS_CLIENT / "dist" / "bench" / script
    return await run_json(path, address, str(iterations), str(warmup))


async def run_command_json(argv: list[str], cwd: Path, what: str) -> dict[str, Any]:
    """Run `argv` in `cwd`; the JSON object it printed on its last line (`what` names it)."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"{what} did not finish within {TIMEOUT_S:.0f} s") from None
    if process.returncode != 0:
        raise RuntimeError(f"{what} exited {process.returncode}: {err.decode()}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def _node(script: Path) -> str:
    """The node executable, once node and the built script are both there."""
    executable = shutil.which("node")
    if executable is None:
        raise RuntimeError(f"`node` is not on PATH: install Node.js 20 or later, then {_SETUP}")
    if not script.is_file():
        raise RuntimeError(f"{script} is missing: {_SETUP}")
    return executable
