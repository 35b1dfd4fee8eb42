"""Real processes for the tests: the installed `dsh-system-prompt serve` command."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import dsh_system_prompt as dsp
import pytest

LISTENING = re.compile(r"listening on (\S+)")


def sidecar_command() -> str:
    """The installed command, preferring the one beside this interpreter."""
    beside = Path(sys.executable).parent / "dsh-system-prompt"
    if beside.exists():
        return str(beside)
    found = shutil.which("dsh-system-prompt")
    assert found, "the dsh-system-prompt command is not installed"
    return found


async def run(
    *command: str | Path,
    timeout: float,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run `command` to its end: exit code, stdout, stderr. Past `timeout` it is killed
    and the test fails, with what it printed."""
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        pytest.fail(
            f"{command[0]} did not finish within {timeout:g}s\n"
            f"stdout:\n{out.decode(errors='replace')}\nstderr:\n{err.decode(errors='replace')}"
        )
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def cli(
    *args: str, timeout: float = 20, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run `dsh-system-prompt ARGS` (stdout piped: plain output); exit code, stdout, stderr.

    `env` adds to the environment (DSP_ADDRESS is dropped from it unless given there).
    """
    environment = {k: v for k, v in os.environ.items() if k != "DSP_ADDRESS"} | (env or {})
    return await run(sidecar_command(), *args, timeout=timeout, env=environment)


async def cli_output(*args: str) -> str:
    """What `dsh-system-prompt ARGS` prints; the test fails unless it exits 0."""
    code, out, err = await cli(*args)
    assert code == 0, err
    return out


def replace_file(path: Path, text: str) -> None:
    """Give `path` the contents `text` at once: a complete file renamed over it, as a
    ConfigMap's swap does. Rewritten in place, a file is empty until written, and a test
    process held off the CPU that long under load let the poller apply it empty."""
    new = path.with_name(path.name + ".new")
    new.write_text(text, encoding="utf-8")
    os.replace(new, path)


@contextlib.asynccontextmanager
async def serve_config(
    config: Path, text: str, *args: str
) -> AsyncIterator[tuple[Served, dsp.Client]]:
    """`serve ARGS` on the config file `config`, first holding `text`; and a client of it."""
    await asyncio.to_thread(config.write_text, text, encoding="utf-8")
    async with (
        serve("--listen", "127.0.0.1:0", "--config", str(config), *args) as served,
        dsp.connect(served.address) as client,
    ):
        yield served, client


@contextlib.asynccontextmanager
async def running(*args: str) -> AsyncIterator[asyncio.StreamReader]:
    """`dsh-system-prompt ARGS` running, its stdout to read; terminated after."""
    process = await asyncio.create_subprocess_exec(
        sidecar_command(), *args, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        yield process.stdout
    finally:
        process.terminate()
        await process.wait()


def free_port() -> int:
    """A loopback port nobody listens on right now (for restarts on one address)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Served:
    """A running `serve` process and what it printed."""

    def __init__(
        self, process: asyncio.subprocess.Process, line: str, address: str, stderr: Path
    ) -> None:
        self.process = process
        self.line = line
        self.address = address
        self.stderr = stderr

    def logs(self) -> str:
        return self.stderr.read_text(errors="replace")


@contextlib.asynccontextmanager
async def serve(*args: str) -> AsyncIterator[Served]:
    """Run `dsh-system-prompt serve ARGS` until it says where it listens; kill it after.

    Its stderr goes to a file, so a chatty sidecar can never block on a full pipe.
    """
    with tempfile.TemporaryDirectory() as folder:
        stderr_path = Path(folder) / "stderr.log"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sidecar_command(), "serve", *args, stdout=asyncio.subprocess.PIPE, stderr=stderr
            )
        try:
            assert process.stdout is not None
            line = (await asyncio.wait_for(process.stdout.readline(), 15)).decode()
            found = LISTENING.search(line)
            if found is None:
                process.kill()
                await asyncio.wait_for(process.wait(), 5)
                pytest.fail(f"serve printed {line!r}; stderr: {stderr_path.read_text()[-2000:]}")
            yield Served(process, line, found.group(1), stderr_path)
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 5)
