"""The Node.js example (examples/node/client.mjs) runs against a real sidecar.

It is an agent on the TypeScript client package (clients/typescript). It needs
`node`, the example's node_modules and the package built, which `make node-deps`
does from the committed lockfiles. Missing any is a failure, not a skip: CI runs
`make test`, which does it first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import BUILTIN_SECTIONS, IDENTITY, section_names
from processes import free_port, run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node"
SETUP = "run `make node-deps` (builds clients/typescript, npm ci in examples/node) first"
TIMEOUT_S = 30

EXPECTED_PROMPT = "\n\n".join(
    [
        IDENTITY,
        "Answer briefly. Prefer small, reviewable changes.",  # the static section
        "Current task: fix the failing test.",  # the dynamic one, from fields_json
        "This section was added by a Node.js listener.",  # the listener's
    ]
)


def node_command() -> list[str]:
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"`node` is not on PATH: install Node.js 18 or later, then {SETUP}")
    package = EXAMPLE / "node_modules" / "@dsh" / "system-prompt"
    if not (package / "dist" / "src" / "index.js").is_file():
        pytest.fail(f"{package} is missing or not built: {SETUP}")
    return [node, str(EXAMPLE / "client.mjs")]


async def run_example(address: str, cwd: Path) -> tuple[int, str, str]:
    """Run the example against `address` (from `cwd`); its exit code, stdout, stderr.

    Asynchronous on purpose: the in-process sidecar serves on this event loop.
    """
    return await run(*node_command(), address, cwd=cwd, timeout=TIMEOUT_S)


def rendered_prompt(output: str) -> str:
    start, end = "--- rendered prompt ---\n", "\n--- end of prompt ---"
    assert start in output and end in output, output
    return output.split(start, 1)[1].split(end, 1)[0]


async def test_node_client_registers_listens_watches_and_renders(
    sidecar: Sidecar, tmp_path: Path
) -> None:
    # Run from elsewhere: the example finds its package relative to itself.
    code, out, err = await run_example(sidecar.address, tmp_path)

    assert code == 0, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert IDENTITY in out
    assert rendered_prompt(out) == EXPECTED_PROMPT
    assert "tools: read_file\n" in out
    assert "as an OpenAI Responses request: " in out  # the example uses a provider adapter
    for event in (
        'registered section "node-example:rules"',
        'registered section "node-example:task"',
        "registered tools",
        'registered listener "addNodeSection"',
    ):
        assert event in out, f"change event {event!r} missing from:\n{out}"
    assert "session closed (OK)" in out

    # Its session ended with the process: everything it registered is gone.
    remaining = sidecar.registry.registrations()
    assert sorted(entry.name for entry in remaining) == sorted(BUILTIN_SECTIONS)
    async with dsp.connect(sidecar.address) as client:
        assembly = await client.assemble(fields={"task": "anything"})
    assert section_names(assembly) == list(BUILTIN_SECTIONS)
    assert assembly.tools == []


async def test_node_client_reports_an_unreachable_sidecar(tmp_path: Path) -> None:
    code, out, err = await run_example(f"127.0.0.1:{free_port()}", tmp_path)

    assert code == 1, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert "error [UNAVAILABLE]" in err
