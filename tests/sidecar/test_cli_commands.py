"""The CLI for people and scripts: assemble, watch, render, health."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_core import package_version
from dsh_system_prompt_server import Sidecar
from helpers import IDENTITY, SidecarFactory, eventually, tool
from processes import cli, cli_output, free_port, running

IGNORE = dsp.FailurePolicy.IGNORE


def no_cwd(_: dsp.AssembleContext) -> str:
    raise RuntimeError("no cwd here")


async def test_assemble_prints_the_rendered_prompt(sidecar: Sidecar, client: dsp.Client) -> None:
    await client.variable("model", "deepseek-v4")
    await client.section("rules", 10, "You run on {{model}}.")
    code, out, err = await cli("assemble", "--address", sidecar.address)
    assert (code, err) == (0, "")
    assert out == f"{IDENTITY}\n\nYou run on deepseek-v4.\n"


async def test_assemble_finds_the_sidecar_at_dsp_address(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, "From the environment.")
    code, out, err = await cli("assemble", env={"DSP_ADDRESS": sidecar.address})
    assert (code, err) == (0, "")
    assert out.endswith("From the environment.\n")


async def test_address_flag_wins_over_dsp_address(sidecar: Sidecar) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    code, out, _ = await cli("health", "--address", sidecar.address, env={"DSP_ADDRESS": nowhere})
    assert (code, out) == (0, "SERVING\n")


async def test_version_prints_the_package_version() -> None:
    code, out, _ = await cli("--version")
    assert (code, out) == (0, f"dsh-system-prompt {package_version()}\n")


async def test_assemble_takes_a_scope_and_fields(sidecar: Sidecar, client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await agent.section("who", 10, lambda ctx: f"Talking to {ctx.get('who')} ({ctx.get('n')}).")
    code, out, _ = await cli(
        "assemble",
        "--address",
        sidecar.address,
        "--scope",
        "agent-1",
        "--field",
        "who=alice",
        "--field",
        "n=3",
    )
    assert code == 0
    assert out.endswith("Talking to alice (3).\n")


async def test_assemble_with_context_prints_the_snapshot(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.context("cwd", 1, "cwd: /work")
    code, out, _ = await cli("assemble", "--address", sidecar.address, "--with-context")
    assert code == 0
    assert out.endswith(
        "Current runtime context. This snapshot supersedes earlier "
        "runtime-context snapshots.\n\ncwd: /work\n"
    )


async def test_assemble_json_is_the_assembly(sidecar: Sidecar, client: dsp.Client) -> None:
    await client.tools([tool("bash")])
    await client.variable("cwd", None)
    code, out, _ = await cli("assemble", "--address", sidecar.address, "--json")
    assert code == 0
    printed = json.loads(out)
    assert printed["tools"] == [
        {"name": "bash", "description": "the bash tool", "parameters": {"type": "object"}}
    ]
    assert printed["variables"] == {"cwd": None}
    assert [s["name"] for s in printed["sections"]] == ["harness:identity", "deployment:persona"]


async def test_assemble_names_each_skipped_step_on_stderr_and_prints_the_prompt_without_it(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("cwd", 20, no_cwd, failure_policy=IGNORE)
    code, out, err = await cli("assemble", "--address", sidecar.address)
    assert (code, out) == (0, f"{IDENTITY}\n\nBe precise.\n")
    (line,) = err.splitlines()
    assert line.startswith(
        'dsh-system-prompt assemble: skipped section "cwd" (global): PROVIDER_FAILED: '
        'section provider "cwd" (global) failed: '
    )
    assert line.endswith("no cwd here")


def hostile_cwd(_: dsp.AssembleContext) -> str:
    raise RuntimeError("no cwd\nforged: line \x1b[31mred\x1b[0m café")


HOSTILE_ESCAPED = "no cwd\\nforged: line \\x1b[31mred\\x1b[0m café"


async def test_assemble_prints_a_skipped_steps_control_characters_as_escapes_one_line_each(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("cwd", 20, hostile_cwd, failure_policy=IGNORE)
    await client.context("pwd", 1, hostile_cwd, failure_policy=IGNORE)
    code, out, err = await cli("assemble", "--address", sidecar.address)
    assert (code, out) == (0, f"{IDENTITY}\n\nBe precise.\n")
    assert "\x1b" not in err
    lines = err.splitlines()
    assert len(lines) == 2
    assert all(line.endswith(HOSTILE_ESCAPED) for line in lines)


async def test_assemble_report_prints_a_skipped_steps_control_characters_as_escapes(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("cwd", 20, hostile_cwd, failure_policy=IGNORE)
    code, out, _ = await cli("assemble", "--address", sidecar.address, "--report")
    assert code == 0
    assert "\x1b" not in out
    (line,) = [line for line in out.splitlines() if "no cwd" in line]
    assert line.startswith('skipped section "cwd" (global): PROVIDER_FAILED: ')
    assert line.endswith(HOSTILE_ESCAPED)


async def test_assemble_json_lists_the_skipped_steps(sidecar: Sidecar, client: dsp.Client) -> None:
    async def weather(assembly: dsp.PromptAssembly, context: Any, next_: dsp.Next) -> Any:
        raise RuntimeError("no weather today")

    off = await client.on_assemble(weather, name="weather", failure_policy=IGNORE)
    listed = [info for info in (await client.snapshot()).registrations if info.name == "weather"]
    out = await cli_output("assemble", "--address", sidecar.address, "--json")  # exit 0
    (step,) = json.loads(out)["skipped"]
    assert step == {
        "kind": "listener",
        "name": "weather",
        "scope": None,
        "ref": listed[0].ref,
        "reason": "LISTENER_FAILED",
        "message": step["message"],
    }
    assert "no weather today" in step["message"]
    await off()
    complete = await cli_output("assemble", "--address", sidecar.address, "--json")
    assert json.loads(complete)["skipped"] == []


async def test_assemble_report_names_a_step_that_timed_out(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)

    async def slow(_: dsp.AssembleContext) -> str:
        await asyncio.sleep(5)
        return "cwd: /src"

    async with dsp.connect(sidecar.address) as client:
        agent = await client.scope("agent-1")
        await agent.context("cwd", 1, slow, failure_policy=IGNORE)
        code, out, err = await cli(
            "assemble", "--address", sidecar.address, "--scope", "agent-1", "--report"
        )
    assert (code, err) == (0, "")
    skipped = [line for line in out.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 1
    assert skipped[0].startswith('skipped context "cwd" (scope "agent-1"): PROVIDER_TIMEOUT: ')


async def test_render_renders_what_assemble_json_printed(
    sidecar: Sidecar, client: dsp.Client, tmp_path: Path
) -> None:
    await client.variable("model", "m1")
    await client.section("rules", 10, "Model {{model}}.")
    _, printed, _ = await cli("assemble", "--address", sidecar.address, "--json")
    (tmp_path / "assembly.json").write_text(printed)
    code, out, _ = await cli("render", str(tmp_path / "assembly.json"))
    _, direct, _ = await cli("assemble", "--address", sidecar.address)
    assert code == 0
    assert out == direct


async def test_render_failure_is_one_line_and_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "assembly.json"
    path.write_text(json.dumps({"sections": [{"name": "s", "text": "{{nope}}"}], "variables": {}}))
    code, out, err = await cli("render", str(path))
    assert (code, out) == (1, "")
    assert err.strip().count("\n") == 0
    assert 'unknown prompt variable "{{nope}}" in section "s"; registered variables: (none)' in err


async def test_render_of_a_malformed_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "assembly.json"
    path.write_text('{"sections": 3}')
    code, _, err = await cli("render", str(path))
    assert code == 2
    assert "assembly file" in err


async def test_a_rejected_assembly_exits_1_with_the_sidecars_message(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("one", 1, "a", complete=True)
    await client.section("two", 2, "b", complete=True)
    code, _, err = await cli("assemble", "--address", sidecar.address)
    assert code == 1
    assert 'multiple complete prompt sections are active: "one", "two"' in err


async def test_an_unreachable_sidecar_exits_3() -> None:
    address = f"127.0.0.1:{free_port()}"
    code, _, err = await cli("assemble", "--address", address, "--timeout", "2")
    assert code == 3
    assert err.startswith("dsh-system-prompt assemble: ")


async def test_a_bad_field_is_a_usage_error(sidecar: Sidecar) -> None:
    code, _, err = await cli("assemble", "--address", sidecar.address, "--field", "novalue")
    assert code == 2
    assert "--field takes key=value" in err


async def test_health_says_serving_and_exits_0(sidecar: Sidecar) -> None:
    assert await cli("health", "--address", sidecar.address) == (0, "SERVING\n", "")


async def test_health_of_a_draining_sidecar_exits_3(sidecar: Sidecar) -> None:
    await sidecar.health.enter_graceful_shutdown()
    code, out, _ = await cli("health", "--address", sidecar.address)
    assert (code, out) == (3, "NOT_SERVING\n")


async def test_health_of_nothing_exits_3() -> None:
    code, _, err = await cli("health", "--address", f"127.0.0.1:{free_port()}", "--timeout", "2")
    assert code == 3
    assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err


async def test_watch_prints_events_as_they_happen(sidecar: Sidecar, client: dsp.Client) -> None:
    async with running("watch", "--address", sidecar.address, "--json") as stdout:
        subscribers = sidecar.registry.changes.subscriber_count
        await eventually(lambda: subscribers() >= 1, "the watch command subscribes", timeout=10)
        await client.section("watched", 1, "x")
        event = json.loads(await asyncio.wait_for(stdout.readline(), 10))
    assert (event["kind"], event["name"], event["action"]) == ("section", "watched", "registered")
