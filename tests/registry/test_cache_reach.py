"""Caches keyed by reach (issue 34, item 6): what the sidecar keeps for an assembly (its
plan, the callback cache's answers, the kept Assemble response) goes with a change to a
layer the assembly reads (its scope's, its ancestors', the global one), and outlives a
change anywhere else: one agent's churn in its own scope empties no one else's caches."""

from __future__ import annotations

import itertools
from typing import Any

import dsh_system_prompt as dsp
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory


class Counted:
    """A text provider that answers how many times it was asked."""

    def __init__(self) -> None:
        self.calls = itertools.count(1)
        self.asked = 0

    def __call__(self, context: dsp.AssembleContext) -> str:
        self.asked = next(self.calls)
        return f"asked {self.asked}"


async def churn(scope: dsp.Scope, pairs: int) -> None:
    """`pairs` register/dispose pairs in bob's own scope."""
    for number in range(pairs):
        handle = await scope.section(f"churn-{number}", 5, "bob's")
        await handle()


async def test_another_scopes_churn_leaves_a_cached_provider_unasked(
    connect: ClientFactory,
) -> None:
    alice, bob = await connect(), await connect()
    await alice.scope("team")
    mine = await alice.scope("alice", parent="team")
    his = await bob.scope("bob", parent="team")
    provider = Counted()
    await mine.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    for _ in range(5):
        await churn(his, 4)
        assembly = await alice.assemble("alice")
        assert [s.text for s in assembly.sections if s.name == "dynamic"] == ["asked 1"]
    assert provider.asked == 1


async def test_a_change_in_a_layer_the_assembly_reads_asks_again(
    connect: ClientFactory,
) -> None:
    alice = await connect()
    team = await alice.scope("team")
    mine = await alice.scope("alice", parent="team")
    provider = Counted()
    await mine.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    await alice.assemble("alice")
    await mine.section("own", 2, "own layer")  # its own layer
    await alice.assemble("alice")
    await team.section("parent", 3, "parent layer")  # its parent's
    await alice.assemble("alice")
    await alice.section("global", 4, "global layer")  # the global one
    await alice.assemble("alice")
    assert provider.asked == 4


async def test_a_global_listener_made_in_another_scope_reaches_the_cached_answer(
    connect: ClientFactory,
) -> None:
    """A step registered with `global` in bob's layer runs on alice's assemblies too: its
    arrival is a change of what they are made of."""
    alice, bob = await connect(), await connect()
    mine = await alice.scope("alice")
    his = await bob.scope("bob")
    provider = Counted()
    await mine.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    await alice.assemble("alice")
    seen: list[str] = []

    async def listener(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> Any:
        seen.append(context.scope)
        return next_()

    await his.on_assemble(listener, global_=True)
    await alice.assemble("alice")
    assert seen == ["alice"] and provider.asked == 2


async def assemble_raw(stub: pb_grpc.SystemPromptServiceStub, scope: str) -> pb.AssembleResponse:
    request = pb.AssembleRequest(context=pb.AssembleContext(scope=scope, fields_json="{}"))
    return await stub.Assemble(request)  # type: ignore[no-any-return]


async def test_a_kept_response_outlives_another_scopes_churn(
    connect: ClientFactory, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    """A static scope's kept response is the very same bytes while bob churns: it was not
    built again (its `revision`, the registry's when it was built, stays), and it says the
    revision of its own chain and the chain's keys."""
    alice, bob = await connect(), await connect()
    team = await alice.scope("team")
    mine = await alice.scope("alice", parent="team")
    his = await bob.scope("bob", parent="team")
    await mine.section("static", 1, "alice's")
    first = await assemble_raw(stub, "alice")
    assert first.cacheable and list(first.scope_chain) == ["alice", "team"]
    await churn(his, 5)
    again = await assemble_raw(stub, "alice")
    assert again.SerializeToString() == first.SerializeToString()
    assert again.cache_revision == first.cache_revision <= first.revision
    await team.section("parent", 2, "team's")
    changed = await assemble_raw(stub, "alice")
    assert changed.cache_revision > first.cache_revision
    assert "parent" in [section.name for section in changed.assembly.sections]


async def test_a_kept_response_for_an_unopened_scope_goes_when_it_is_opened(
    connect: ClientFactory, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    """A key no handle holds assembles the global layer; opening it (with a parent) is a
    change of what it reads, so its response, even the one kept for its very request
    bytes, is not reused."""
    alice = await connect()
    team = await alice.scope("team")
    await team.section("parent", 2, "team's")
    before = await assemble_raw(stub, "later")
    assert list(before.scope_chain) == [] and "parent" not in str(before.assembly)
    assert (await assemble_raw(stub, "later")).SerializeToString() == before.SerializeToString()
    await alice.scope("later", parent="team")
    after = await assemble_raw(stub, "later")
    assert list(after.scope_chain) == ["later", "team"]
    assert "parent" in [section.name for section in after.assembly.sections]


async def test_keys_opened_and_closed_leave_a_bounded_trace(
    connect: ClientFactory, sidecar: Sidecar, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    """Each scope key's last change is remembered only while a handle holds the key (swept
    once 1,024 are gone): an agent opening and closing scopes under fresh keys grows it
    no further, and a scope that lives keeps its answers through the sweeps."""
    alice, bob = await connect(), await connect()
    mine = await alice.scope("alice")
    await mine.section("static", 1, "alice's")
    first = await assemble_raw(stub, "alice")
    for number in range(1500):
        scope = await bob.scope(f"fresh-{number}")
        await scope.dispose()
    assert len(sidecar.state.registry.layer_revisions) <= 1024
    again = await assemble_raw(stub, "alice")
    assert again.SerializeToString() == first.SerializeToString()
