"""Listings: the registry at one revision, filtered by scope and kind, values on request."""

from __future__ import annotations

import dsh_system_prompt as dsp
import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, raw_channel, raw_stub, scope_tree, tool


def by_name(snapshot: dsp.Snapshot) -> dict[str, dsp.RegistrationInfo]:
    return {info.name: info for info in snapshot.registrations if info.kind != "scope"}


async def test_a_listing_shows_each_registration_with_its_owner_size_and_fingerprint(
    sidecar: Sidecar,
) -> None:
    agent = await dsp.connect(sidecar.address, client_name="agent")
    try:
        scope = await agent.scope("agent-1")
        await scope.section("rules", 10, "Be precise.")
        await agent.variable("model", "deepseek-v4")
        await agent.context("cwd", 5, lambda ctx: "/tmp")
        snapshot = await agent.snapshot()
        listed = by_name(snapshot)
        rules = listed["rules"]
        assert (rules.kind, rules.scope, rules.order, rules.dynamic, rules.owner) == (
            "section",
            "agent-1",
            10.0,
            False,
            "agent",
        )
        assert rules.size_bytes == len("Be precise.")
        assert len(rules.fingerprint) == 16 and not rules.has_value
        assert (listed["cwd"].dynamic, listed["cwd"].fingerprint) == (True, "")
        assert listed["model"].order is None
        assert listed["harness:identity"].owner_label == "built-in"
        assert snapshot.revision == (await agent.snapshot()).revision
    finally:
        await agent.close()


async def test_equal_values_have_equal_fingerprints_and_an_update_changes_it(
    client: dsp.Client,
) -> None:
    one = await client.section("one", 1, "same text")
    await client.context("two", 1, "same text")
    before = by_name(await client.snapshot())
    assert before["one"].fingerprint == before["two"].fingerprint
    await one.update("other text")
    assert by_name(await client.snapshot())["one"].fingerprint != before["one"].fingerprint


async def test_two_sessions_of_one_client_name_have_different_owner_labels(
    connect: ClientFactory,
) -> None:
    one, two = await connect(), await connect()
    await one.section("a", 1, "a")
    await two.section("b", 1, "b")
    listed = by_name(await one.snapshot())
    assert listed["a"].owner == listed["b"].owner
    assert listed["a"].owner_label != listed["b"].owner_label


async def test_values_are_listed_only_when_asked_for(client: dsp.Client) -> None:
    await client.variable("who", None)
    await client.tools([tool("bash")])
    await client.section("rules", 1, "text")
    listed = by_name(await client.snapshot(values=True))
    assert (listed["rules"].has_value, listed["rules"].value) == (True, "text")
    assert (listed["who"].has_value, listed["who"].value) == (True, None)
    tools = next(i for i in (await client.snapshot(kinds=["tools"], values=True)).registrations)
    assert isinstance(tools.value, dsp.ToolProviderResult)
    assert [schema.name for schema in tools.value.schemas] == ["bash"]


async def test_a_scope_filter_keeps_its_layer_and_with_ancestors_the_chain(
    client: dsp.Client,
) -> None:
    team, agent, other = await scope_tree(client)
    await client.section("global", 1, "g")
    await team.section("team-rules", 1, "t")
    await agent.section("agent-rules", 1, "a")
    await other.section("other-rules", 1, "o")
    own = await client.snapshot("agent-1", kinds=["section"])
    chain = await client.snapshot("agent-1", ancestors=True, kinds=["section"])
    assert [info.name for info in own.registrations] == ["agent-rules"]
    assert set(by_name(chain)) == {
        "harness:identity",
        dsp.PERSONA_SECTION,
        "global",
        "team-rules",
        "agent-rules",
    }


async def test_a_listing_is_sent_in_batches_that_share_one_revision(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    for index in range(600):
        await client.variable(f"v{index}", "x")
    async with raw_channel(sidecar.address) as channel:
        batches = [
            b async for b in raw_stub(channel).ListRegistrations(pb.ListRegistrationsRequest())
        ]
    assert len(batches) >= 3
    assert len({(b.revision, b.incarnation) for b in batches}) == 1
    assert sum(len(b.registrations) for b in batches) == 602  # with the built-ins


async def test_a_listing_with_an_oversized_scope_is_refused(client: dsp.Client) -> None:
    try:
        await client.snapshot("x" * 5000)
    except dsp.SystemPromptError as error:
        assert (error.code, error.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            dsp.Reason.VALUE_TOO_LARGE,
        )
    else:
        raise AssertionError("an oversized scope was accepted")
