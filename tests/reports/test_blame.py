"""Prompt-cache reports blame the right part: removals, listeners' own steps, layers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import dsh_system_prompt as dsp
import pytest
from helpers import ClientFactory, report_of

Next = Callable[..., Awaitable[dsp.PromptAssembly]]


async def stability(
    client: dsp.Client,
    scope: str | None = None,
    layout: dsp.PrefixLayout | None = None,
    **fields: object,
) -> dsp.PrefixStability:
    return (await report_of(client, scope, layout=layout, **fields)).stability


@pytest.mark.parametrize("layout", ["tools-first", "system-first"])
async def test_a_removed_tool_is_named_at_its_old_place(
    client: dsp.Client, layout: dsp.PrefixLayout
) -> None:
    await client.tools([dsp.ToolSchema("bash", "b", {}), dsp.ToolSchema("read", "r", {})])
    grep = await client.tools([dsp.ToolSchema("grep", "g", {})])
    await stability(client, layout=layout)
    await grep()
    after = await stability(client, layout=layout)
    assert (after.first_changed, after.reason) == ('tool "grep"', 'tool "grep" removed')
    assert after.diff.startswith('-{\n-  "name": "grep",')


async def test_a_section_a_listener_drops_is_named_with_the_listener(client: dsp.Client) -> None:
    async def dropper(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        if ctx.get("drop"):
            assembly.sections = [s for s in assembly.sections if s.name != "memory"]
        return await next_()

    await client.section("memory", 50, "Remember the milk.")
    await client.section("tail", 60, "The end.")
    dropper.__qualname__ = "dropper"
    await client.on_assemble(dropper)
    await stability(client, drop=False)
    after = await stability(client, drop=True)
    assert after.first_changed == 'section "memory"'
    assert after.reason == 'section "memory" removed (by listener "dropper")'


async def test_a_listener_appending_a_fixed_suffix_is_not_blamed_for_an_upstream_change(
    client: dsp.Client,
) -> None:
    async def suffix(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections = [
            dsp.AssembledSection(s.name, s.text + " Always.") if s.name == "rules" else s
            for s in assembly.sections
        ]
        return await next_()

    await client.section("rules", 10, lambda ctx: f"Use {ctx.get('tool')}.")
    await client.on_assemble(suffix)
    await stability(client, tool="grep")
    after = await stability(client, tool="ripgrep")
    assert after.reason == 'section "rules" text changed'


async def test_a_listener_that_changes_its_own_output_after_next_is_blamed(
    client: dsp.Client,
) -> None:
    async def stamp(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        result = await next_()
        result.sections = [
            dsp.AssembledSection(s.name, f"{s.text} ({ctx.get('turn')})")
            if s.name == "rules"
            else s
            for s in result.sections
        ]
        return result

    async def upper(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        return await next_()  # passes everything on unchanged

    await client.section("rules", 10, "Be precise.")
    stamp.__qualname__ = "stamp"
    await client.on_assemble(stamp)
    await client.on_assemble(upper)
    await stability(client, turn=1)
    after = await stability(client, turn=2)
    assert after.reason == 'listener "stamp" changed section "rules"'


async def test_a_variable_a_listener_sets_says_so(client: dsp.Client) -> None:
    async def cwd(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.variables["cwd"] = ctx.get("cwd")
        return await next_()

    await client.variable("cwd", "/")
    await client.section("where", 20, "cwd: {{cwd}}")
    cwd.__qualname__ = "cwd"
    await client.on_assemble(cwd)
    await stability(client, cwd="/a")
    after = await stability(client, cwd="/b")
    assert after.reason == (
        'section "where" text changed (variable {{cwd}} changed, set by listener "cwd")'
    )


MANY = [f"v{index}" for index in range(10)]
MANY_TEXT = " ".join(f"{{{{{name}}}}}" for name in MANY)


async def test_a_reason_names_four_changed_variables_and_counts_the_rest(
    client: dsp.Client,
) -> None:
    for name in MANY:
        await client.variable(name, lambda ctx, name=name: f"{name}@{ctx.get('turn')}")
    await client.section("many", 20, MANY_TEXT)
    await stability(client, turn=1)
    after = await stability(client, turn=2)
    assert after.reason == (
        'section "many" text changed (variables {{v0}}, {{v1}}, {{v2}}, {{v3}} and 6 more changed)'
    )


async def test_a_reason_names_four_variables_a_listener_set_and_counts_the_rest(
    client: dsp.Client,
) -> None:
    async def setter(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        for name in MANY:
            assembly.variables[name] = f"{name}@{ctx.get('turn')}"
        return await next_()

    for name in MANY:
        await client.variable(name, "")
    await client.section("many", 20, MANY_TEXT)
    setter.__qualname__ = "setter"
    await client.on_assemble(setter)
    await stability(client, turn=1)
    after = await stability(client, turn=2)
    said = [f'variable {{{{v{index}}}}} changed, set by listener "setter"' for index in range(4)]
    assert after.reason == (
        f'section "many" text changed ({"; ".join(said)}; 6 more variables changed)'
    )


async def test_a_new_shadowing_section_and_its_removal_have_their_own_reasons(
    client: dsp.Client,
) -> None:
    agent = await client.scope("agent-1")
    await client.section("rules", 10, "Global rules.")
    await stability(client, "agent-1")
    shadowing = await agent.section("rules", 10, "Agent rules.")
    shadowed = await stability(client, "agent-1")
    assert shadowed.reason == 'section "rules" now from scope "agent-1", shadowing global'
    await shadowing()
    unshadowed = await stability(client, "agent-1")
    assert unshadowed.reason == (
        'section "rules" no longer shadowed: now from global, was scope "agent-1"'
    )


async def test_a_variable_shadowed_by_a_scope_names_the_layer(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await client.variable("model", "global-model")
    await client.section("model", 10, "Model: {{model}}.")
    await stability(client, "agent-1")
    await agent.variable("model", "agent-model")
    after = await stability(client, "agent-1")
    assert after.reason == (
        'section "model" text changed (variable {{model}} changed,'
        ' now from scope "agent-1", shadowing global)'
    )


async def test_a_re_parented_scope_is_named(client: dsp.Client, connect: ClientFactory) -> None:
    team_a = await client.scope("team-a")
    team_b = await client.scope("team-b")
    await team_a.section("team", 10, "Team A's way.")
    await team_b.section("team", 10, "Team B's way.")
    other = await connect()
    agent = await other.scope("agent-1", parent="team-a")
    await stability(client, "agent-1")
    await agent.dispose()  # the key is forgotten with its last handle, parent binding included
    await other.scope("agent-1", parent="team-b")
    after = await stability(client, "agent-1")
    assert after.reason == (
        'section "team" now from scope "team-b" (ancestor of "agent-1"),'
        ' was scope "team-a" (ancestor of "agent-1"):'
        ' scope "agent-1" re-parented from "team-a" to "team-b"'
    )


@pytest.mark.parametrize(
    ("layout", "stable_part"), [("tools-first", ""), ("system-first", "the whole system prompt")]
)
async def test_a_tool_change_throws_away_what_follows_it_in_the_layout(
    client: dsp.Client, layout: dsp.PrefixLayout, stable_part: str
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.tools(lambda ctx: [dsp.ToolSchema("bash", f"v{ctx.get('v')}", {})])
    rendered = await client.render(report=True, prefix_layout=layout, fields={"v": 1})
    after = await stability(client, layout=layout, v=2)
    assert after.reason == 'tool "bash" description changed'
    tool_head = len('{"name":"bash","description":"v')
    prompt = len(rendered.prompt.encode()) + 2  # and the blank line before the tools
    assert after.stable_bytes == (prompt + tool_head if stable_part else tool_head)
