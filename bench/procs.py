"""Servers in their own processes: the sidecar under test and the echo baseline.

A client and a server in one process share one core, one GIL and one event
loop, which distorts exactly the ratios this suite reports, so every server
runs as a child process and the bench process is only ever the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import admin_views, echo, floods, floor, watchers

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = Path(tempfile.gettempdir()) / f"dsp-bench-{os.getpid()}"
SIDECAR_READY = "dsh-system-prompt listening on "
START_TIMEOUT_S = 30.0


@dataclass
class ServerProcess:
    """A child process serving gRPC at `address` until `stop()`."""

    process: asyncio.subprocess.Process
    address: str
    label: str
    config: str | None = None  # the file written for it (its config), removed when it stops

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_kib(self) -> int:
        """Resident set size now, from /proc/<pid>/status (VmRSS, KiB)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for pid {self.pid}")

    def private_dirty_kib(self) -> int:
        """Memory the process alone holds and wrote, from /proc/<pid>/smaps_rollup (KiB)."""
        for line in Path(f"/proc/{self.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
        raise RuntimeError(f"no Private_Dirty for pid {self.pid}")

    def cpu_ns(self) -> int:
        """CPU time every thread of the process has run, in nanoseconds (the scheduler's
        own count, /proc/<pid>/task/*/schedstat: finer than the 10 ms ticks of `stat`)."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                total += int((task / "schedstat").read_text().split()[0])
        return total

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used, from /proc/<pid>/stat."""
        return cpu_seconds(self.pid)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.config is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config)


async def start_sidecar(
    listen: str = "127.0.0.1:0", config: dict[str, Any] | None = None, label: str = "sidecar"
) -> ServerProcess:
    """`dsh-system-prompt serve` with a config file written from `config`."""
    argv = sidecar_argv(listen)
    if not config:
        return await _start(argv, SIDECAR_READY, label)
    handle, path = tempfile.mkstemp(prefix="dsp-bench-", suffix=".toml")
    with os.fdopen(handle, "w") as file:
        file.write(_toml(config))
    try:
        sidecar = await _start([*argv, "--config", path], SIDECAR_READY, label)
    except BaseException:
        os.unlink(path)
        raise
    sidecar.config = path
    return sidecar


async def start_echo(listen: str = "127.0.0.1:0") -> ServerProcess:
    argv = [sys.executable, "-m", "bench.echo", "--listen", listen]
    return await _start(argv, echo.READY, "echo")


async def start_floor(listen: str = "127.0.0.1:0", response: bytes = b"") -> ServerProcess:
    """The floor (`bench/floor.py`), answering every Assemble with `response`."""
    argv = floor_argv(listen)
    if not response:
        return await _start(argv, floor.READY, "floor")
    handle, path = tempfile.mkstemp(prefix="dsp-bench-floor-", suffix=".bin")
    with os.fdopen(handle, "wb") as file:
        file.write(response)
    try:
        server = await _start([*argv, "--response", path], floor.READY, "floor")
    except BaseException:
        os.unlink(path)
        raise
    server.config = path  # removed when it stops
    return server


def sidecar_argv(listen: str) -> list[str]:
    """The command of a sidecar with the default config, serving on `listen`."""
    return [sys.executable, "-c", _CLI, "serve", "--listen", listen]


def floor_argv(listen: str) -> list[str]:
    return [sys.executable, "-m", "bench.floor", "--listen", listen]


async def start_watchers(address: str, count: int) -> ServerProcess:
    """`count` idle WatchChanges streams on `address`, read by a process of their own."""
    argv = [sys.executable, "-m", "bench.watchers", address, str(count)]
    return await _start(argv, watchers.READY, "watchers")


async def start_plain_watchers(
    address: str, count: int, per_channel: int, burst: int, out: Path, window_s: float
) -> ServerProcess:
    """`count` WatchChanges streams without change-batches, `per_channel` to a connection,
    noting when each was told of each of the next `burst` revisions (`bench/watchers.py`);
    `finished()` waits for the notes in `out`."""
    argv = [sys.executable, "-m", "bench.watchers", address, str(count), "--plain"]
    argv += ["--per-channel", str(per_channel), "--burst", str(burst), "--out", str(out)]
    return await _start([*argv, "--window", str(window_s)], watchers.READY, "plain-watchers")


async def finished(process: ServerProcess, line: str, timeout_s: float) -> None:
    """Wait until `process` prints `line` (or ends), at most `timeout_s`."""
    stdout = process.process.stdout
    assert stdout is not None
    async with asyncio.timeout(timeout_s):
        while said := (await stdout.readline()).decode():
            if said.strip() == line:
                return


async def start_admin_views(url: str, count: int) -> ServerProcess:
    """`count` live admin views of the page at `url`, read by a process of their own."""
    argv = [sys.executable, "-m", "bench.admin_views", url, str(count)]
    return await _start(argv, admin_views.READY, "admin-views")


async def start_flood(address: str, kind: str) -> ServerProcess:
    """The flood `kind` of `bench.floods` on `address`, from a process of its own."""
    argv = [sys.executable, "-m", "bench.floods", address, kind]
    return await _start(argv, floods.READY, f"flood-{kind}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time process `pid` has used, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# cli.py has no `if __name__ == "__main__"`; call its main() the way the script does.
_CLI = (
    "import sys; from dsh_system_prompt_server.sidecar.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


async def _start(argv: Sequence[str], ready: str, label: str) -> ServerProcess:
    # The server's log goes to a file: it is not part of the table, but it is
    # where to look when a server fails to start or misbehaves.
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{label}.log"
    with log.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=ROOT
        )
    assert process.stdout is not None
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := (await process.stdout.readline()).decode():
                if line.startswith(ready):
                    return ServerProcess(process, line[len(ready) :].strip(), label)
    except TimeoutError:
        pass
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()
    raise RuntimeError(f"{label} did not start: {' '.join(argv)}; see {log}")


def _toml(config: dict[str, Any]) -> str:
    lines = []
    tables = {key: value for key, value in config.items() if isinstance(value, dict)}
    arrays = {
        key: value
        for key, value in config.items()
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value)
    }
    for key, value in config.items():
        if key in tables or key in arrays:
            continue
        if isinstance(value, bool):
            rendered = "true" if value else "false"
        elif isinstance(value, str):
            rendered = _string(value)
        elif isinstance(value, list):
            rendered = "[" + ", ".join(_string(item) for item in value) + "]"
        else:
            rendered = repr(value)
        lines.append(f"{key} = {rendered}")
    for key, table in tables.items():  # after every top-level key, as TOML wants
        lines.append(f"[{key}]\n{_toml(table)}")
    for key, items in arrays.items():  # arrays of tables: [[credentials]]
        lines += [f"[[{key}]]\n{_toml(item)}" for item in items]
    return "\n".join(lines) + "\n"


def _string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
