"""Scopes: layers over the global layer, parent chains, shadowing and disposal."""

from __future__ import annotations

from dataclasses import dataclass

import dsh_system_prompt as dsp
import grpc
import pytest
from helpers import (
    IDENTITY,
    ClientFactory,
    ClientOf,
    chain,
    context,
    context_names,
    failure,
    refusal,
    rejection,
    section,
    section_names,
    tool,
    tool_names,
)

IDENTITY_SECTION = "harness:identity"


@dataclass(frozen=True)
class Shared:
    """Two sessions, each with a handle on the scope "agent-1"."""

    first: dsp.Client
    second: dsp.Client
    one: dsp.Scope  # first's
    two: dsp.Scope  # second's


@pytest.fixture
async def shared(connect: ClientFactory) -> Shared:
    first, second = await connect(), await connect()
    one, two = await first.scope("agent-1"), await second.scope("agent-1")
    return Shared(first=first, second=second, one=one, two=two)


# -- shadowing ------------------------------------------------------------------------


async def test_a_scoped_persona_shadows_the_configured_one_for_that_scope(
    client_of: ClientOf,
) -> None:
    async with client_of(persona="Global persona.") as client:
        agent = await client.scope("agent-1")
        await agent.section(dsp.PERSONA_SECTION, dsp.PERSONA_ORDER, "Agent persona.")
        scoped = await client.assemble(scope="agent-1")
        unscoped = await client.assemble()
    assert scoped.sections == [
        section(IDENTITY_SECTION, IDENTITY),
        section(dsp.PERSONA_SECTION, "Agent persona."),
    ]
    assert unscoped.sections[1] == section(dsp.PERSONA_SECTION, "Global persona.")


async def test_a_scoped_section_shadows_a_global_one_of_the_same_name(client: dsp.Client) -> None:
    await client.section("rules", 10, "Global rules.")
    agent = await client.scope("agent-1")
    await agent.section("rules", 10, "Agent rules.")
    assembly = await client.assemble(scope="agent-1")
    assert assembly.sections[2:] == [section("rules", "Agent rules.")]


async def test_a_shadowing_section_is_placed_by_its_own_order(client: dsp.Client) -> None:
    await client.section("notes", 50, "Global notes.")
    await client.section("rules", 10, "Rules.")
    agent = await client.scope("agent-1")
    await agent.section("notes", -5, "Agent notes.")
    assembly = await client.assemble(scope="agent-1")
    assert section_names(assembly) == [IDENTITY_SECTION, "notes", dsp.PERSONA_SECTION, "rules"]


async def test_scoped_sections_join_the_global_ones_by_order(client: dsp.Client) -> None:
    await client.section("global-20", 20, "g")
    agent = await client.scope("agent-1")
    await agent.section("agent-10", 10, "a")
    await agent.section("agent-30", 30, "a")
    assembly = await client.assemble(scope="agent-1")
    assert section_names(assembly)[2:] == ["agent-10", "global-20", "agent-30"]


async def test_scoped_sections_are_not_in_the_global_assembly(client: dsp.Client) -> None:
    before = await client.assemble()
    agent = await client.scope("agent-1")
    await agent.section("agent-only", 10, "a")
    await agent.context("agent-context", 1, "c")
    await agent.variable("agent_var", "v")
    await agent.tools([tool("agent_tool")])
    assert await client.assemble() == before


async def test_a_scoped_variable_shadows_a_global_one(client: dsp.Client) -> None:
    await client.variable("model", "global-model")
    agent = await client.scope("agent-1")
    await agent.variable("model", "agent-model")
    assert (await client.assemble(scope="agent-1")).variables == {"model": "agent-model"}


async def test_a_scoped_context_shadows_a_global_one(client: dsp.Client) -> None:
    await client.context("policy", 1, "Global policy.")
    await client.context("clock", 2, "Noon.")
    agent = await client.scope("agent-1")
    await agent.context("policy", 3, "Agent policy.")
    assembly = await client.assemble(scope="agent-1")
    assert assembly.contexts == [context("clock", "Noon."), context("policy", "Agent policy.")]


async def test_a_scopes_tools_are_added_to_the_global_tools(client: dsp.Client) -> None:
    await client.tools([tool("bash")])
    agent = await client.scope("agent-1")
    await agent.tools([tool("agent_tool")])
    assert tool_names(await client.assemble(scope="agent-1")) == ["agent_tool", "bash"]


async def test_a_scoped_tool_with_a_global_tools_name_does_not_shadow_it(
    client: dsp.Client,
) -> None:
    await client.tools([tool("bash", "global bash")])
    agent = await client.scope("agent-1")
    await agent.tools([tool("bash", "agent bash")])
    assembly = await client.assemble(scope="agent-1")
    assert [t.description for t in assembly.tools] == ["global bash", "agent bash"]


async def test_the_same_name_may_be_registered_in_two_scopes(client: dsp.Client) -> None:
    one = await client.scope("agent-1")
    two = await client.scope("agent-2")
    await one.section("rules", 10, "One.")
    await two.section("rules", 10, "Two.")
    assert (await client.assemble(scope="agent-1")).sections[-1] == section("rules", "One.")
    assert (await client.assemble(scope="agent-2")).sections[-1] == section("rules", "Two.")


async def test_disposing_a_shadowing_section_restores_the_global_one(client: dsp.Client) -> None:
    await client.section("rules", 10, "Global rules.")
    agent = await client.scope("agent-1")
    off = await agent.section("rules", 10, "Agent rules.")
    await off()
    assembly = await client.assemble(scope="agent-1")
    assert assembly.sections[2:] == [section("rules", "Global rules.")]


# -- parent chains --------------------------------------------------------------------


async def layer_sections(client: dsp.Client) -> None:
    """The chain org > team > worker, each with a section named for its layer."""
    for order, layer in enumerate(await chain(client), start=2):
        await layer.section(layer.key, order * 10, layer.key[0])


async def test_a_child_sees_its_parents_and_grandparents_layers(client: dsp.Client) -> None:
    await client.section("global", 10, "g")
    await layer_sections(client)
    assembly = await client.assemble(scope="worker")
    assert section_names(assembly)[2:] == ["global", "org", "team", "worker"]


async def test_a_parent_does_not_see_its_childs_layer(client: dsp.Client) -> None:
    await layer_sections(client)
    assert section_names(await client.assemble(scope="team"))[2:] == ["org", "team"]
    assert section_names(await client.assemble(scope="org"))[2:] == ["org"]


async def test_the_nearest_layer_wins_a_section_name(client: dsp.Client) -> None:
    grandparent, parent, child = await chain(client)
    await client.section("who", 10, "global")
    await grandparent.section("who", 10, "org")
    await parent.section("who", 10, "team")
    await child.section("who", 10, "worker")
    assert (await client.assemble(scope="worker")).sections[-1] == section("who", "worker")
    assert (await client.assemble(scope="team")).sections[-1] == section("who", "team")
    assert (await client.assemble(scope="org")).sections[-1] == section("who", "org")
    assert (await client.assemble()).sections[-1] == section("who", "global")


async def test_the_nearest_layer_wins_a_variable_and_a_context(client: dsp.Client) -> None:
    grandparent, parent, _ = await chain(client)
    await grandparent.variable("mode", "org")
    await parent.variable("mode", "team")
    await grandparent.context("policy", 1, "org")
    await parent.context("policy", 1, "team")
    assembly = await client.assemble(scope="worker")
    assert assembly.variables == {"mode": "team"}
    assert assembly.contexts == [context("policy", "team")]


async def test_a_child_gets_its_ancestors_tools(client: dsp.Client) -> None:
    grandparent, parent, _ = await chain(client)
    await grandparent.tools([tool("org_tool")])
    await parent.tools([tool("team_tool")])
    assert tool_names(await client.assemble(scope="worker")) == ["org_tool", "team_tool"]


async def test_a_scoped_persona_in_a_parent_applies_to_its_children(
    client_of: ClientOf,
) -> None:
    async with client_of(persona="Global persona.") as client:
        team = await client.scope("team")
        await client.scope("worker", parent="team")
        await team.section(dsp.PERSONA_SECTION, 0, "Team persona.")
        assembly = await client.assemble(scope="worker")
    assert assembly.sections[1] == section(dsp.PERSONA_SECTION, "Team persona.")


async def test_a_childs_assembly_does_not_see_a_sibling(client: dsp.Client) -> None:
    await client.scope("team")
    one = await client.scope("worker-1", parent="team")
    two = await client.scope("worker-2", parent="team")
    await one.section("one", 10, "1")
    await two.section("two", 10, "2")
    await two.variable("two_var", "2")
    await two.tools([tool("two_tool")])
    assembly = await client.assemble(scope="worker-1")
    assert section_names(assembly)[2:] == ["one"]
    assert assembly.variables == {}
    assert assembly.tools == []


async def test_a_parent_bound_before_it_is_opened_still_chains(client: dsp.Client) -> None:
    child = await client.scope("worker", parent="team")
    await child.section("worker", 20, "w")
    team = await client.scope("team")
    await team.section("team", 10, "t")
    assert section_names(await client.assemble(scope="worker"))[2:] == ["team", "worker"]


# -- binding parents ------------------------------------------------------------------


@pytest.mark.parametrize("parent", ["team", None], ids=["same-parent", "no-parent"])
async def test_reopening_with_the_same_parent_or_none_keeps_the_bound_parent(
    connect: ClientFactory, parent: str | None
) -> None:
    first, second = await connect(), await connect()
    team = await first.scope("team")
    await team.section("team", 10, "t")
    await first.scope("worker", parent="team")
    worker = await second.scope("worker", parent=parent)
    await worker.section("worker", 20, "w")
    assert section_names(await second.assemble(scope="worker"))[2:] == ["team", "worker"]


async def test_a_conflicting_parent_is_rejected(client: dsp.Client) -> None:
    await client.scope("worker", parent="team-a")
    error = await rejection(client.scope("worker", parent="team-b"))
    assert error.code == grpc.StatusCode.ALREADY_EXISTS


async def test_a_conflicting_parent_from_another_session_is_rejected(
    connect: ClientFactory,
) -> None:
    first, second = await connect(), await connect()
    await first.scope("worker", parent="team-a")
    error = await rejection(second.scope("worker", parent="team-b"))
    assert error.code == grpc.StatusCode.ALREADY_EXISTS


async def test_a_rejected_parent_leaves_the_bound_parent_in_place(client: dsp.Client) -> None:
    team_a = await client.scope("team-a")
    team_b = await client.scope("team-b")
    await team_a.section("a", 10, "a")
    await team_b.section("b", 10, "b")
    await client.scope("worker", parent="team-a")
    await rejection(client.scope("worker", parent="team-b"))
    assert section_names(await client.assemble(scope="worker"))[2:] == ["a"]


async def test_a_parent_that_would_close_a_cycle_is_rejected(client: dsp.Client) -> None:
    await client.scope("a", parent="b")
    error = await rejection(client.scope("b", parent="a"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_longer_cycle_is_rejected(client: dsp.Client) -> None:
    await client.scope("a", parent="b")
    await client.scope("b", parent="c")
    error = await rejection(client.scope("c", parent="a"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_scope_cannot_be_its_own_parent(client: dsp.Client) -> None:
    error = await rejection(client.scope("a", parent="a"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_rejected_cycle_leaves_the_chain_intact(client: dsp.Client) -> None:
    b = await client.scope("b")
    await b.section("b", 10, "b")
    a = await client.scope("a", parent="b")
    await a.section("a", 20, "a")
    await rejection(client.scope("b", parent="a"))
    assert section_names(await client.assemble(scope="a"))[2:] == ["b", "a"]
    assert section_names(await client.assemble(scope="b"))[2:] == ["b"]


# -- disposal -------------------------------------------------------------------------


async def test_disposing_a_scope_disposes_everything_made_through_it(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    before = await client.assemble(scope="agent-1")
    await agent.section("rules", 10, "Agent rules.")
    await agent.context("policy", 1, "Agent policy.")
    await agent.variable("mode", "agent")
    await agent.tools([tool("agent_tool")])
    await agent.dispose()
    assert await client.assemble(scope="agent-1") == before


async def test_disposing_a_scope_disposes_its_suppressor(client: dsp.Client) -> None:
    await client.context("policy", 1, "Global policy.")
    agent = await client.scope("agent-1")
    await agent.suppress_runtime_context()
    await agent.dispose()
    assert context_names(await client.assemble(scope="agent-1")) == ["policy"]


async def test_disposing_a_scope_keeps_global_registrations(client: dsp.Client) -> None:
    await client.section("rules", 10, "Global rules.")
    await client.variable("mode", "global")
    agent = await client.scope("agent-1")
    await agent.section("rules", 10, "Agent rules.")
    await agent.dispose()
    assembly = await client.assemble(scope="agent-1")
    assert assembly.sections[2:] == [section("rules", "Global rules.")]
    assert assembly.variables == {"mode": "global"}


async def test_disposing_a_scope_keeps_another_handles_registrations(shared: Shared) -> None:
    await shared.one.section("mine", 10, "mine")
    await shared.two.section("theirs", 20, "theirs")
    await shared.one.dispose()
    assert section_names(await shared.second.assemble(scope="agent-1"))[2:] == ["theirs"]


async def test_disposing_a_scope_twice_is_harmless(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await agent.section("rules", 10, "Agent rules.")
    await agent.dispose()
    await agent.dispose()
    assert section_names(await client.assemble(scope="agent-1"))[2:] == []


async def test_a_registration_disposed_before_its_scope_stays_disposed(
    client: dsp.Client,
) -> None:
    agent = await client.scope("agent-1")
    off = await agent.section("rules", 10, "Agent rules.")
    await agent.section("notes", 20, "Agent notes.")
    await off()
    await agent.dispose()
    await off()
    assert section_names(await client.assemble(scope="agent-1"))[2:] == []


async def test_registering_through_a_disposed_scope_fails(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await agent.dispose()
    await rejection(agent.section("rules", 10, "late"))
    assert section_names(await client.assemble(scope="agent-1"))[2:] == []


# -- two sessions, one key ------------------------------------------------------------


async def test_two_sessions_opening_one_key_share_its_layer(shared: Shared) -> None:
    await shared.one.section("one", 10, "1")
    await shared.two.section("two", 20, "2")
    assert section_names(await shared.first.assemble(scope="agent-1"))[2:] == ["one", "two"]


async def test_two_sessions_opening_one_key_share_its_names(shared: Shared) -> None:
    await shared.one.section("rules", 10, "1")
    error = await rejection(shared.two.section("rules", 20, "2"))
    assert failure(error) == refusal(
        "DUPLICATE_NAME", 'prompt section "rules" is already registered in this scope'
    )


async def test_one_sessions_end_leaves_the_others_registrations_in_the_shared_scope(
    shared: Shared,
) -> None:
    await shared.one.section("one", 10, "1")
    await shared.two.section("two", 20, "2")
    await shared.first.close()
    assert section_names(await shared.second.assemble(scope="agent-1"))[2:] == ["two"]


async def test_two_handles_of_one_session_on_one_key_dispose_separately(
    client: dsp.Client,
) -> None:
    one = await client.scope("agent-1")
    two = await client.scope("agent-1")
    await one.section("one", 10, "1")
    await two.section("two", 20, "2")
    await one.dispose()
    assert section_names(await client.assemble(scope="agent-1"))[2:] == ["two"]
