"""Runtime contexts: apart from sections, ordered, rendered as a snapshot; and their
suppression. The naming and order rules they share with sections are tested, over both,
in test_sections.py."""

from __future__ import annotations

import dsh_system_prompt as dsp
import grpc
from helpers import (
    ClientFactory,
    ClientOf,
    added,
    context,
    rejection,
    section,
    section_names,
)

# -- runtime contexts -----------------------------------------------------------------


async def test_contexts_are_separate_from_sections(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    assembly = await client.assemble()
    assert assembly.contexts == [context("policy", "Mode: plan.")]
    assert "policy" not in section_names(assembly)


async def test_contexts_are_sorted_by_ascending_order(client: dsp.Client) -> None:
    ordered = await added(client, "context", ("late", 30), ("early", -10), ("middle", 0))
    assert ordered == ["early", "middle", "late"]


async def test_contexts_with_equal_order_keep_registration_order(client: dsp.Client) -> None:
    ordered = await added(client, "context", ("bravo", 7), ("alpha", 7), ("charlie", 7))
    assert ordered == ["bravo", "alpha", "charlie"]


async def test_a_section_and_a_context_may_share_a_name(client: dsp.Client) -> None:
    await client.section("policy", 10, "section text")
    await client.context("policy", 10, "context text")
    assembly = await client.assemble()
    assert assembly.sections[-1] == section("policy", "section text")
    assert assembly.contexts == [context("policy", "context text")]


async def test_contexts_render_as_a_snapshot_on_the_sidecar(client: dsp.Client) -> None:
    await client.context("second", 2, "Two.")
    await client.context("first", 1, "One.")
    rendered = await client.render()
    assert rendered.context_snapshot == (
        "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
        "\n\nOne.\n\nTwo."
    )


# -- runtime-context suppression ------------------------------------------------------


async def test_a_global_suppressor_removes_every_context(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    scope = await client.scope("agent-1")
    await scope.context("agent-policy", 2, "Agent mode.")
    await client.suppress_runtime_context()
    assert (await client.assemble()).contexts == []
    assert (await client.assemble(scope="agent-1")).contexts == []


async def test_a_suppressor_leaves_sections_tools_and_variables(client: dsp.Client) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.tools([dsp.ToolSchema("echo", "echo back", {"type": "object"})])
    await client.variable("mode", "plan")
    before = await client.assemble()
    await client.context("policy", 1, "Mode: {{mode}}.")
    await client.suppress_runtime_context()
    assert await client.assemble() == before


async def test_disposing_the_only_suppressor_restores_contexts(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    off = await client.suppress_runtime_context()
    await off()
    assert (await client.assemble()).contexts == [context("policy", "Mode: plan.")]


async def test_suppressors_compose_until_the_last_is_disposed(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    first = await client.suppress_runtime_context()
    second = await client.suppress_runtime_context()
    await first()
    assert (await client.assemble()).contexts == []
    await second()
    assert (await client.assemble()).contexts == [context("policy", "Mode: plan.")]


async def test_suppressors_of_different_sessions_compose(connect: ClientFactory) -> None:
    first, second = await connect(), await connect()
    await first.context("policy", 1, "Mode: plan.")
    await first.suppress_runtime_context()
    off = await second.suppress_runtime_context()
    await first.close()
    await second.context("policy", 1, "Mode: act.")
    assert (await second.assemble()).contexts == []
    await off()
    assert (await second.assemble()).contexts == [context("policy", "Mode: act.")]


async def test_a_scoped_suppressor_affects_only_that_scope(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    agent = await client.scope("agent-1")
    await client.scope("agent-2")
    await agent.suppress_runtime_context()
    assert (await client.assemble(scope="agent-1")).contexts == []
    assert (await client.assemble()).contexts == [context("policy", "Mode: plan.")]
    assert (await client.assemble(scope="agent-2")).contexts == [context("policy", "Mode: plan.")]


async def test_a_scoped_suppressor_affects_that_scopes_descendants(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    parent = await client.scope("team")
    child = await client.scope("worker", parent="team")
    await child.context("worker-policy", 2, "Worker mode.")
    await client.scope("grandchild", parent="worker")
    await parent.suppress_runtime_context()
    assert (await client.assemble(scope="worker")).contexts == []
    assert (await client.assemble(scope="grandchild")).contexts == []


async def test_a_child_scopes_suppressor_does_not_affect_its_parent(client: dsp.Client) -> None:
    await client.context("policy", 1, "Mode: plan.")
    await client.scope("team")
    child = await client.scope("worker", parent="team")
    await child.suppress_runtime_context()
    assert (await client.assemble(scope="team")).contexts == [context("policy", "Mode: plan.")]


async def test_disposing_a_scoped_suppressor_restores_that_scopes_contexts(
    client: dsp.Client,
) -> None:
    await client.context("policy", 1, "Mode: plan.")
    agent = await client.scope("agent-1")
    off = await agent.suppress_runtime_context()
    await off()
    assert (await client.assemble(scope="agent-1")).contexts == [context("policy", "Mode: plan.")]


async def test_a_suppressed_assembly_renders_an_empty_context_snapshot(
    client: dsp.Client,
) -> None:
    await client.context("policy", 1, "Mode: {{unregistered}}.")
    await client.suppress_runtime_context()
    rendered = await client.render()
    assert rendered.context_snapshot == ""


async def test_include_runtime_context_false_removes_every_context(
    client_of: ClientOf,
) -> None:
    async with client_of(include_runtime_context=False) as client:
        await client.context("policy", 1, "Mode: plan.")
        scope = await client.scope("agent-1")
        await scope.context("agent-policy", 2, "Agent mode.")
        assert (await client.assemble()).contexts == []
        assert (await client.assemble(scope="agent-1")).contexts == []
        assert (await client.render()).context_snapshot == ""


async def test_include_runtime_context_false_still_validates_context_registrations(
    client_of: ClientOf,
) -> None:
    async with client_of(include_runtime_context=False) as client:
        await client.context("policy", 1, "Mode: plan.")
        error = await rejection(client.context("policy", 2, "again"))
    assert error.code == grpc.StatusCode.ALREADY_EXISTS
