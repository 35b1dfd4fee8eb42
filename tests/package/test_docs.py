"""The docs stay true: the docs check catches what does not exist, and the README's first
example runs as printed, beside examples/python/agent.py on one sidecar."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest
from dsh_system_prompt_server import Sidecar
from processes import run

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import check_docs  # noqa: E402

TRACKED = check_docs.tracked_files()


def problems(text: str) -> list[str]:
    return list(check_docs.check_text("doc.md", text, TRACKED))


def test_the_docs_name_only_what_exists() -> None:
    assert list(check_docs.check()) == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("see `server/dsh_system_prompt_server/gone.py`", "no such file"),
        ("run `dsh-system-prompt serve --no-such-flag`", "no such CLI flag"),
        ("| key | default |\n|---|---|\n| `no_such_key` | 1 |\n", "no such config key"),
        ("```toml\nno_such_key = 1\n```\n", "no such config key"),
        ("scrape `dsp_no_such_metric`", "no such metric"),
    ],
)
def test_the_docs_check_reports_what_does_not_exist(text: str, problem: str) -> None:
    assert [line.split(": ")[1].split(" `")[0] for line in problems(text)] == [problem]


def test_the_docs_check_takes_real_names_from_their_sources() -> None:
    text = (
        "`server/dsh_system_prompt_server/sidecar/cli.py`, `service.py`, `--tokenizer`,"
        " `dsp_cache_breaks_total`, `dsp_cache_*`\n"
        "| key | default |\n|---|---|\n| `tool_order` | |\n| `max_listeners` | |\n"
    )
    assert problems(text) == []


def test_every_reference_to_a_section_names_a_heading_of_its_document() -> None:
    text = (
        'see docs/protocol.md, "Part slots", and `docs/protocol.md`, "The local cache" and\n'
        '// "Ejected callbacks"; docs/rules.md "Layers and scopes"; (docs/protocol.md,\n'
        '   # "Long gone")\n * docs/operations.md, "Quotas per client" or "No such part"\n'
        'docs/gone.md, "Anything"\n'
    )
    assert list(check_docs.heading_refs(text)) == [
        ("docs/protocol.md", "Part slots"),
        ("docs/protocol.md", "The local cache"),
        ("docs/protocol.md", "Ejected callbacks"),
        ("docs/rules.md", "Layers and scopes"),
        ("docs/protocol.md", "Long gone"),
        ("docs/operations.md", "Quotas per client"),
        ("docs/operations.md", "No such part"),
        ("docs/gone.md", "Anything"),
    ]
    assert list(check_docs.check_heading_refs("a.go", text)) == [
        'a.go: no heading "Long gone" in `docs/protocol.md`',
        'a.go: no heading "No such part" in `docs/operations.md`',
        "a.go: no such document `docs/gone.md`",
    ]
    # The files read: docs, READMEs, the code's comments and the proto, not generated code.
    read = check_docs.referring(TRACKED)
    assert {"README.md", "clients/go/README.md", "clients/go/dsp/ejection.go"} <= read
    assert "proto/dsh/systemprompt/v1/system_prompt.proto" in read
    assert not any("/gen/" in f or f == "docs/contract.md" for f in read)


def test_the_map_has_a_short_line_for_every_folder_and_no_other() -> None:
    text = check_docs.ARCHITECTURE.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if check_docs.FOLDER_ROW.match(line)]
    wire = next(row for row in rows if row.startswith("| `server/.../wire/`"))
    changed = text.replace(wire + "\n", "").replace(
        "| `server/.../guard/` |", "| `server/.../guard/` | " + "x" * check_docs.MAX_ROW
    )
    changed += "\n| `server/.../gone/` | a folder no longer there |\n"
    found = list(check_docs.check_architecture(changed, TRACKED))
    assert [line.split(": ", 1)[1].split(" `")[0] for line in found] == [
        "no line for the folder",
        "a line for",
        "the line for",
    ], found


def test_every_module_says_what_it_holds() -> None:
    assert not check_docs.has_docstring("import os\n", "a.py")
    assert not check_docs.has_docstring("package dsp\n", "a.go")
    assert check_docs.has_docstring('"""What a holds."""\n', "a.py")
    assert check_docs.has_docstring("/** What a holds. */\nexport {};\n", "a.ts")
    assert len(check_docs.modules(TRACKED)) > 150  # every package's, the TS and Go clients'


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- readme-example -->\n```python\n(.*?)```", text, re.S)
    assert found is not None, "README.md has no <!-- readme-example --> block"
    return found.group(1)


async def test_the_readme_example_runs_beside_the_example_agent(sidecar: Sidecar) -> None:
    env = {**os.environ, "DSP_ADDRESS": sidecar.address}
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "python" / "agent.py"),
        sidecar.address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        assert agent.stdout is not None
        line = await asyncio.wait_for(agent.stdout.readline(), 30)
        assert line == b"registered; Ctrl-C to leave\n"
        code, out, err = await run(sys.executable, "-c", readme_example(), timeout=30, env=env)
        # the agent, meanwhile, made a model request of its prompt through a provider adapter
        async with asyncio.timeout(30):
            while not (line := await agent.stdout.readline()).startswith(b"as an"):
                assert line, "the agent ended before making its request"
    finally:
        agent.kill()
        await agent.wait()
    assert (code, err) == (0, "")
    assert "Review Python; change nothing." in out
    assert "Working directory: /work." in out
    assert line == (
        b"as an Anthropic request: tools bash, read;"
        b" report to {'scope': 'agent-1', 'report_key': None}\n"
    )
