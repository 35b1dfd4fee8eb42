"""The Go README's consumer recipe ("Your own module") as printed: a module of its own that
requires the client through a replace to a checkout, built offline in module mode from a
vendor/ of links to the client and Debian's sources; the agent it builds runs on a sidecar.

It needs Debian's Go packages, which `make go-tools` installs (`make test` does it first):
missing them is a failure, not a skip.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
from pathlib import Path

import pytest
from dsh_system_prompt_server import Sidecar
from processes import run

ROOT = Path(__file__).resolve().parents[2]
SETUP = "run `make go-tools` (Debian: golang-go golang-google-grpc-dev ...)"
BUILD_TIMEOUT_S = 600  # a cold build cache compiles gRPC on a loaded machine
AGENT_TIMEOUT_S = 30


def recipe() -> str:
    """The shell block of clients/go/README.md marked `<!-- go-consumer -->`."""
    text = (ROOT / "clients" / "go" / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- go-consumer -->\n```sh\n(.*?)```", text, re.S)
    assert block is not None, "clients/go/README.md has no <!-- go-consumer --> block"
    return block.group(1)


def go_environment() -> dict[str, str]:
    """This environment without the GOPATH-mode settings `make go-test` runs under: the
    recipe's own words decide how Go builds."""
    if shutil.which("go") is None:
        pytest.fail(f"`go` is not on PATH: {SETUP}")
    if not (Path("/usr/share/gocode/src/google.golang.org/grpc") / "go.mod").is_file():
        pytest.fail(f"Debian's gRPC sources are missing: {SETUP}")
    dropped = ("GO111MODULE", "GOFLAGS", "GOPATH", "GOPROXY", "DSP_ADDRESS")
    return {key: value for key, value in os.environ.items() if key not in dropped}


async def test_the_readme_recipe_builds_an_agent_offline_that_runs(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    environment = go_environment()
    (tmp_path / "dsh-system-prompt").symlink_to(ROOT)  # the checkout, beside the agent
    agent = tmp_path / "my-agent"
    agent.mkdir()
    shutil.copy(ROOT / "examples" / "go" / "main.go", agent)

    code, out, err = await run(
        "bash", "-euc", recipe(), cwd=agent, env=environment, timeout=BUILD_TIMEOUT_S
    )
    assert code == 0, f"the recipe failed ({code}):\n{out}\n{err}"
    assert (agent / "go.mod").is_file() and not (agent / "go.sum").exists()

    process = await asyncio.create_subprocess_exec(
        agent / "my-agent",
        env={**environment, "DSP_ADDRESS": sidecar.address},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    printed: list[str] = []
    try:
        async with asyncio.timeout(AGENT_TIMEOUT_S):
            while not printed or printed[-1] != "You are a careful Go agent running deepseek-v4.":
                line = await process.stdout.readline()
                assert line, f"the agent exited having printed {printed}"
                printed.append(line.decode().rstrip("\n"))
        # Its parts are the sidecar's: registered on the agent's scope.
        names = {e.name for e in sidecar.registry.registrations() if e.scope == "go-agent"}
        assert {"role", "cwd", "model"} <= names, names
    finally:
        process.send_signal(signal.SIGINT)  # the agent leaves on Ctrl-C
        await asyncio.wait_for(process.wait(), AGENT_TIMEOUT_S)
    assert printed[:2] == ["registered; Ctrl-C to leave", "prompt:"]
