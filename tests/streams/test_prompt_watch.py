"""Live prompts per scope: the static prompt at each burst of changes, with the cache verdict."""

from __future__ import annotations

import asyncio
import json

import dsh_system_prompt as dsp
from dsh_system_prompt import FailurePolicy, Mutation, Rule, RulePart
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, tool, tool_names
from processes import running


async def next_prompt(prompts: dsp.PromptStream, timeout: float = 10) -> dsp.PromptChange:
    return await asyncio.wait_for(anext(prompts), timeout)


async def test_dynamic_parts_are_placeholders_and_never_evaluated(client: dsp.Client) -> None:
    calls: list[str] = []

    def cwd(context: dsp.AssembleContext) -> str:
        calls.append("cwd")
        return "/work"

    agent = await client.scope("agent-1")
    await agent.section("cwd", 20, cwd)
    await agent.variable("who", lambda context: "alice")
    await agent.section("greeting", 10, "Hello {{who}}.")
    prompts = await client.watch_prompt("agent-1", render=True)
    first = await next_prompt(prompts)
    assert first.prompt is not None
    assert 'Hello <dynamic variable "who">.' in first.prompt
    assert '<dynamic section "cwd">' in first.prompt
    assert first.changes == [] and calls == []
    assert first.report is not None and not first.report.stability.has_previous


async def test_an_update_sends_the_new_prompt_with_the_change_and_the_cache_verdict(
    client: dsp.Client,
) -> None:
    agent = await client.scope("agent-1")
    await client.section("rules", 10, "Be precise.")
    memory = await agent.section("memory", 50, "Memory: nothing yet.")
    await agent.section("task", 60, "Task: write tests.")
    prompts = await client.watch_prompt("agent-1", render=True)
    await next_prompt(prompts)
    revision = await memory.update("Memory: the user likes tea.")
    change = await next_prompt(prompts)
    assert [(e.revision, e.action, e.name) for e in change.changes] == [
        (revision, "updated", "memory")
    ]
    assert change.prompt is not None and "the user likes tea" in change.prompt
    assert change.report is not None
    stability = change.report.stability
    assert (stability.has_previous, stability.first_changed) == (True, 'section "memory"')
    assert 0 < stability.stable_bytes < stability.prefix.bytes


async def test_a_burst_of_changes_is_coalesced_into_few_prompts(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar: Sidecar = await make_sidecar(prompt_coalesce_s=0.3)
    async with dsp.connect(sidecar.address) as client:
        memory = await client.section("memory", 1, "v0")
        prompts = await client.watch_prompt()
        await next_prompt(prompts)
        for index in range(1, 51):
            await memory.update(f"v{index}")
        received: list[dsp.PromptChange] = []
        while not received or received[-1].revision < sidecar.registry.revision:
            received.append(await next_prompt(prompts))
    assert len(received) < 10
    assert sum(len(c.changes) + c.changes_omitted for c in received) == 50
    assert received[-1].assembly is not None
    assert received[-1].assembly.sections[-1].text == "v50"


async def test_changes_outside_the_scopes_chain_send_nothing(client: dsp.Client) -> None:
    team = await client.scope("team")
    await client.scope("agent-1", parent="team")
    other = await client.scope("agent-2")
    prompts = await client.watch_prompt("agent-1")
    await next_prompt(prompts)
    await other.section("elsewhere", 1, "x")
    await team.section("inherited", 1, "y")
    change = await next_prompt(prompts)
    assert [e.name for e in change.changes] == ["inherited"]
    assert change.assembly is not None
    assert "elsewhere" not in [s.name for s in change.assembly.sections]


async def test_a_prompt_watcher_that_never_reads_slows_no_registration(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar: Sidecar = await make_sidecar(
        watch_buffer=8, prompt_coalesce_s=0, provider_timeout_s=60
    )
    async with dsp.connect(sidecar.address) as client:
        memory = await client.section("memory", 1, "x" * 60_000)  # big prompts fill the windows
        stuck = await client.watch_prompt(render=True)  # never read until the end
        loop = asyncio.get_running_loop()
        started = loop.time()
        for index in range(300):
            await memory.update(f"{index}" + "x" * 60_000)
        assert loop.time() - started < 30
        last = sidecar.registry.revision
        seen: list[dsp.PromptChange] = []
        while not seen or seen[-1].revision < last:
            seen.append(await next_prompt(stuck))
    assert seen[-1].assembly is not None
    assert seen[-1].assembly.sections[-1].text.startswith("299")
    assert any(change.changes_omitted for change in seen)


async def test_the_cli_watch_prompt_shows_the_change_and_the_cache_verdict(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    agent = await client.scope("agent-1")
    memory = await agent.section("memory", 50, "Memory: nothing yet.")
    async with running(
        "watch", "--address", sidecar.address, "--scope", "agent-1", "--prompt", "--json"
    ) as stdout:
        first = json.loads(await asyncio.wait_for(stdout.readline(), 15))
        assert "Memory: nothing yet." in first["prompt"]
        await memory.update("Memory: the user likes tea.")
        change = json.loads(await asyncio.wait_for(stdout.readline(), 15))
    assert [(c["action"], c["name"]) for c in change["changes"]] == [("updated", "memory")]
    assert "the user likes tea" in change["prompt"]
    assert change["cache"]["first_changed"] == 'section "memory"'
    assert 'section "memory"' in change["cache"]["reason"]


async def test_the_cli_watch_prompt_prints_the_verdict_for_people(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    agent = await client.scope("agent-1")
    memory = await agent.section("memory", 50, "Memory: nothing yet.")
    lines: list[str] = []
    async with running(
        "watch", "--address", sidecar.address, "--scope", "agent-1", "--prompt"
    ) as stdout:

        async def read_until(text: str) -> None:
            while not any(text in line for line in lines):
                lines.append((await stdout.readline()).decode())

        await asyncio.wait_for(read_until("first report"), 15)
        await memory.update("Memory: the user likes tea.")
        await asyncio.wait_for(read_until("cache broken by"), 15)
    shown = "".join(lines)
    assert "changed: r" in shown and "updated section memory (scope agent-1)" in shown
    assert 'cache broken by section "memory"' in shown


async def test_watchers_of_one_scope_share_one_prompt_and_each_stream_starts_afresh(
    client: dsp.Client, sidecar: Sidecar
) -> None:
    memory = await client.section("memory", 1, "v0")
    streams = [await client.watch_prompt() for _ in range(8)]
    for stream in streams:
        await next_prompt(stream)
    await memory.update("v1")
    changed = [await next_prompt(stream) for stream in streams]
    late = await client.watch_prompt()
    first = await next_prompt(late)
    assert len(sidecar.state.watches.shared_prompts()) == 1
    assert all(c.report is not None and c.report.stability.has_previous for c in changed)
    assert first.report is not None and not first.report.stability.has_previous
    assert first.assembly is not None and first.assembly.sections[-1].text == "v1"


async def test_a_live_prompt_runs_the_rules_with_no_fields(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await client.tools([tool("bash"), tool("web_fetch")])
    await agent.section("intro", 10, "Hello.")
    await agent.rule("no-web", Rule([Mutation.drop_tools("tool.name == 'web_fetch'")]))
    note = Mutation.upsert_sections(RulePart("note", 20, "'no fields: ' + string(size(fields))"))
    await agent.rule("note", Rule([note]))
    # a rule whose field is missing: under IGNORE passed over, as an Assemble without fields
    await agent.rule("by-field", Rule(match=["fields.x"], failure_policy=FailurePolicy.IGNORE))
    prompts = await client.watch_prompt("agent-1", render=True)
    first = await next_prompt(prompts)
    assert first.assembly is not None and not first.error
    assert tool_names(first.assembly) == ["bash"]
    assert [section.name for section in first.assembly.sections][-2:] == ["intro", "note"]
    assert first.prompt is not None and "no fields: 0" in first.prompt
    # under FAIL, the live prompt shows the assembly's error
    await agent.rule("strict", Rule([Mutation.drop_tools("tool.name == fields.agent")]))
    change = await next_prompt(prompts)
    assert change.assembly is None
    assert change.error == (
        'rule "strict" failed: mutations[0].drop_tools: Key not found in map : "agent"'
    )


async def test_a_live_prompt_runs_a_global_rule_made_in_another_scope(client: dsp.Client) -> None:
    """A rule registered with `global` in agent-2's layer runs for agent-1's assemblies:
    agent-1's live prompt follows it (its watch of the chain is told of the rule)."""
    agent, other = await client.scope("agent-1"), await client.scope("agent-2")
    await client.tools([tool("bash"), tool("web_fetch")])
    await agent.section("intro", 10, "Hello.")
    prompts = await client.watch_prompt("agent-1")
    first = await next_prompt(prompts)
    assert first.assembly is not None and tool_names(first.assembly) == ["bash", "web_fetch"]
    drop = Rule([Mutation.drop_tools("tool.name == 'web_fetch'")])
    await other.rule("no-web", drop, global_=True)
    change = await next_prompt(prompts)
    assert change.assembly is not None and tool_names(change.assembly) == ["bash"]
