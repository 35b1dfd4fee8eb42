"""docs/adapters.md's Python agent loop, run as written against a real sidecar: two turns of
assemble, adapt, call the model (the SDK's mock transport), report the usage."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from helpers import SidecarFactory
from processes import run

DOC = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"


def block(marker: str, language: str) -> str:
    """The code block of docs/adapters.md marked `<!-- marker -->`."""
    found = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", DOC.read_text("utf-8"), re.S)
    assert found is not None, f"docs/adapters.md has no <!-- {marker} --> block"
    return found.group(1)


async def test_the_python_loop_reports_each_turns_usage(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar()
    script = tmp_path / "loop.py"
    script.write_text(block("adapters-python-loop", "python"), encoding="utf-8")
    code, out, err = await run(sys.executable, script, sidecar.address, timeout=60)
    assert code == 0, err
    assert out.splitlines() == [
        "turn 1: 64 of 120 prompt tokens cached, report 1 of conv-7",
        "turn 2: 64 of 120 prompt tokens cached, report 2 of conv-7",
    ]
