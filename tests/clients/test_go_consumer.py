"""The Go README's consumer recipe ("Your own module") as printed: a module of its own that
requires the client through a replace to a checkout, built offline in module mode from a
vendor/ of links to the client and Debian's sources; the agent it builds runs on a sidecar,
and so does the README's plugin ("A plugin"), built the same way.

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
EXAMPLE_AGENT = (ROOT / "examples" / "go" / "main.go").read_text(encoding="utf-8")


def readme_block(marker: str, language: str) -> str:
    """The code block of clients/go/README.md marked `<!-- marker -->`."""
    text = (ROOT / "clients" / "go" / "README.md").read_text(encoding="utf-8")
    block = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", text, re.S)
    assert block is not None, f"clients/go/README.md has no <!-- {marker} --> block"
    return block.group(1)


def workspace(agent: Path, main: str) -> None:
    """`agent` holding `main` as main.go, beside a link to the checkout."""
    (agent.parent / "dsh-system-prompt").symlink_to(ROOT)
    agent.mkdir()
    (agent / "main.go").write_text(main, encoding="utf-8")


async def build(agent: Path, main: str, environment: dict[str, str]) -> Path:
    """The recipe run as printed in `agent` (beside a link to the checkout) over `main`."""
    workspace(agent, main)
    code, out, err = await run(
        "bash",
        "-euc",
        readme_block("go-consumer", "sh"),
        cwd=agent,
        env=environment,
        timeout=BUILD_TIMEOUT_S,
    )
    assert code == 0, f"the recipe failed ({code}):\n{out}\n{err}"
    assert sorted(os.listdir(agent)) == ["go.mod", "main.go", "my-agent", "vendor"]  # no go.sum
    return agent / "my-agent"


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
    binary = await build(tmp_path / "my-agent", EXAMPLE_AGENT, environment)

    process = await asyncio.create_subprocess_exec(
        binary,
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


async def test_the_readme_plugin_registers_its_parts_in_one_run(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    environment = go_environment()
    binary = await build(tmp_path / "my-agent", readme_block("go-plugin", "go"), environment)
    code, out, err = await run(
        binary,
        cwd=tmp_path,
        env={**environment, "DSP_ADDRESS": sidecar.address},
        timeout=AGENT_TIMEOUT_S,
    )
    assert code == 0, f"the plugin failed ({code}):\n{out}\n{err}"
    assert out.split("\n\n")[1:] == [
        "You review Go code on deepseek-v4.",
        f"Working directory: {tmp_path}.",
        "Sign as reviewer.\n",
    ]
