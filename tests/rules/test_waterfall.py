"""Rules in the one waterfall with listeners, their scopes, and their life as registrations:
owned by a session, disposed, updated in place, seen in change events and listings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import dsh_system_prompt as dsp
from dsh_system_prompt import Mutation, Rule, RulePart
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, eventually, next_events, section_names, tool, tool_names

from rules.stock import TOOLS, stocked

Next = Callable[..., Awaitable[dsp.PromptAssembly]]


def adding(name: str) -> Callable[..., Awaitable[dsp.PromptAssembly]]:
    """A listener that appends section `name` (its text: the sections it saw) before next()."""

    async def listener(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        seen = ",".join(s.name for s in assembly.sections if s.name in ("one", "rule", "two"))
        assembly.sections.append(dsp.AssembledSection(name, seen))
        return await next_()

    listener.__qualname__ = name
    return listener


def appends(name: str) -> Rule:
    """A rule that appends section `name` saying which of one, rule, two it saw (in that
    order: a filter and a map over every section are over one evaluation's cost bound)."""
    seen = "['one', 'rule', 'two'].filter(n, assembly.sections.exists(s, s.name == n)).join(',')"
    return Rule([Mutation.upsert_sections(RulePart(name, 1000, seen))])


async def test_a_rule_between_two_listeners_sees_the_first_s_result(client: dsp.Client) -> None:
    await client.on_assemble(adding("one"))
    await client.rule("rule", appends("rule"))
    await client.on_assemble(adding("two"))
    assembly = await client.assemble()
    assert [(s.name, s.text) for s in assembly.sections[-3:]] == [
        ("one", ""),
        ("rule", "one"),
        ("two", "one,rule"),
    ]


async def test_prepend_puts_a_rule_before_the_steps_registered_earlier(
    client: dsp.Client,
) -> None:
    await client.on_assemble(adding("one"))
    await client.on_assemble(adding("two"))
    await client.rule("rule", appends("rule"), prepend=True)
    assert section_names(await client.assemble())[-3:] == ["rule", "one", "two"]


async def test_a_scoped_rule_runs_for_its_scope_and_below_global_for_every_one(
    client: dsp.Client,
) -> None:
    await stocked(client)
    team = await client.scope("team")
    await client.scope("agent-1", parent="team")
    await team.rule("team-only", Rule([Mutation.drop_tools("tool.name == 'bash'")]))
    await team.rule(
        "everywhere", Rule([Mutation.drop_tools("tool.name == 'todo_write'")]), global_=True
    )
    assert tool_names(await client.assemble("agent-1")) == [
        "mcp__github__issue",
        "mcp__github__pr",
        "web_fetch",
    ]
    assert tool_names(await client.assemble("other")) == [
        "bash",
        "mcp__github__issue",
        "mcp__github__pr",
        "web_fetch",
    ]


async def test_a_rule_goes_with_its_session(sidecar: Sidecar, connect: ClientFactory) -> None:
    owner = await connect()
    reader = await connect()
    await reader.tools([tool("bash")])
    await owner.rule("none", Rule([Mutation.drop_tools("true")]))
    assert tool_names(await reader.assemble()) == []
    await owner.close()

    async def back() -> bool:
        return tool_names(await reader.assemble()) == ["bash"]

    await eventually(back, "the assembly without the closed session's rule")
    assert not [e for e in sidecar.registry.registrations() if e.kind.value == "rule"]


async def test_a_handle_disposes_its_rule(client: dsp.Client) -> None:
    await stocked(client)
    handle = await client.rule("none", Rule([Mutation.drop_tools("true")]))
    assert tool_names(await client.assemble()) == []
    await handle()
    assert tool_names(await client.assemble()) == TOOLS
    await handle()  # twice does nothing


async def test_update_replaces_what_a_rule_does_and_keeps_its_place(client: dsp.Client) -> None:
    await client.on_assemble(adding("one"))
    handle = await client.rule("rule", appends("rule"))
    await client.on_assemble(adding("two"))
    changes = await client.watch_changes(kinds=["rule"])
    shout = Rule([Mutation.upsert_sections(RulePart("rule", 1000, "'updated'"))])
    revision = await handle.update(shout)
    assert section_names(await client.assemble())[-3:] == ["one", "rule", "two"]
    assert (await client.assemble()).sections[-2] == dsp.AssembledSection("rule", "updated")
    [event] = await next_events(changes, 1)
    seen = (event.kind, event.action, event.name, event.revision)
    assert seen == ("rule", "updated", "rule", revision)
    assert await handle.update(shout) == revision  # the same rule again changes nothing
    error = None
    try:
        await handle.update(Rule(match=["1"]))
    except dsp.SystemPromptError as refused:
        error = refused
    assert error is not None and error.reason == "RULE_INVALID"
    assert (await client.assemble()).sections[-2].text == "updated"  # a refused update: none
    await changes.close()


async def test_a_rule_is_a_change_event_and_a_listing_with_its_value(client: dsp.Client) -> None:
    changes = await client.watch_changes(kinds=["rule"])
    rule = Rule([Mutation.tool_order(["bash"])], match=["scope != ''"], variables={"v": "1"})
    handle = await client.rule("ordered", rule)
    [registered] = await next_events(changes, 1)
    seen = (registered.kind, registered.action, registered.name, registered.scope)
    assert seen == ("rule", "registered", "ordered", None)
    assert registered.fingerprint
    snapshot = await client.snapshot(kinds=["rule"], values=True)
    [info] = snapshot.registrations
    assert (info.kind, info.name, info.ref, info.dynamic) == (
        "rule",
        "ordered",
        registered.ref,
        False,
    )
    assert info.value == rule
    await handle()
    [gone] = await next_events(changes, 1)
    assert (gone.kind, gone.action, gone.ref) == ("rule", "unregistered", registered.ref)
    await changes.close()
