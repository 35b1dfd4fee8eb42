"""The local cache keyed by reach and bounded in bytes (issue 34, items 6 and 8): a kept
answer goes with a change to a layer it read and outlives changes anywhere else; what is
kept is bounded by `local_cache_bytes`; and an agent that may read only its own scopes
has a local cache too, watching each scope it assembles."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, SidecarFactory, eventually, section_names

from .test_local_cache import served, texts


@pytest.fixture
async def caching(sidecar: Sidecar) -> AsyncIterator[dsp.Client]:
    async with dsp.connect(sidecar.address, local_cache=True) as client:
        yield client


async def test_another_scopes_churn_leaves_the_kept_answer(
    sidecar: Sidecar, connect: ClientFactory, caching: dsp.Client
) -> None:
    """bob registers and disposes in his own scope between alice's assemblies; alice's
    scope (under a parent they share) is asked once."""
    alice, bob = await connect(), await connect()
    await alice.scope("team")
    mine = await alice.scope("alice", parent="team")
    his = await bob.scope("bob", parent="team")
    await mine.section("rules", 10, "alice's")
    await caching.assemble("alice")
    before = served(sidecar)
    for number in range(20):
        handle = await his.section(f"churn-{number}", 5, "bob's")
        await caching.assemble("alice")
        await handle()
        assert texts(await caching.assemble("alice"))["rules"] == "alice's"
    assert served(sidecar) == before


async def test_a_change_of_a_layer_the_answer_read_reaches_it(
    connect: ClientFactory, caching: dsp.Client
) -> None:
    alice = await connect()
    team = await alice.scope("team")
    mine = await alice.scope("alice", parent="team")
    await mine.section("rules", 10, "alice's")
    await eventually(lambda: sees(caching, "alice", "rules"), "alice's section")
    await team.section("parent", 5, "team's")
    await eventually(lambda: sees(caching, "alice", "parent"), "the parent's section")
    await alice.section("global", 1, "everyone's")
    await eventually(lambda: sees(caching, "alice", "global"), "the global section")


async def test_opening_a_scope_kept_unopened_reaches_its_answer(
    connect: ClientFactory, caching: dsp.Client
) -> None:
    """A key no handle holds assembles the global layer; once opened under a parent, the
    parent's layer is what it reads."""
    alice = await connect()
    team = await alice.scope("team")
    await team.section("parent", 5, "team's")
    assert "parent" not in section_names(await caching.assemble("later"))
    await alice.scope("later", parent="team")
    await eventually(lambda: sees(caching, "later", "parent"), "the parent's section")


async def test_a_global_listener_made_in_another_scope_reaches_the_kept_answer(
    connect: ClientFactory, caching: dsp.Client
) -> None:
    alice, bob = await connect(), await connect()
    await (await alice.scope("alice")).section("rules", 10, "alice's")
    await caching.assemble("alice")
    await (await bob.scope("bob")).on_assemble(mark, global_=True)
    await eventually(lambda: sees(caching, "alice", "marked"), "bob's global listener")


@pytest.mark.parametrize("step", ["listener", "rule"])
async def test_a_step_registered_on_another_scope_leaves_the_kept_answer(
    sidecar: Sidecar, connect: ClientFactory, caching: dsp.Client, step: str
) -> None:
    """A listener or rule registered on bob's scope (not `global`) runs for bob's
    assemblies only: its event says `global` false, so alice's kept answer stays (before,
    any step's event dropped every kept answer). The marker registered after it in carol's
    scope, once seen, tells that the step's event came first (one stream, in order)."""
    alice, bob = await connect(), await connect()
    await (await alice.scope("alice")).section("rules", 10, "alice's")
    await eventually(lambda: kept(sidecar, caching, "alice"), "a kept answer")
    his = await bob.scope("bob")
    if step == "listener":
        await his.on_assemble(mark)
    else:
        await his.rule("mark", dsp.Rule([dsp.Mutation.drop_sections("section.name == 'rules'")]))
    await (await bob.scope("carol")).section("marker", 1, "after the step")
    await eventually(lambda: sees(caching, "carol", "marker"), "the marker after the step")
    before = served(sidecar)
    assert texts(await caching.assemble("alice"))["rules"] == "alice's"
    assert served(sidecar) == before


async def test_a_scope_forgotten_with_its_parent_is_not_served_its_old_chain(
    sidecar: Sidecar, connect: ClientFactory, caching: dsp.Client
) -> None:
    await forgets_its_parent(sidecar, await connect(), caching)


async def forgets_its_parent(sidecar: Sidecar, owner: dsp.Client, cache: dsp.Client) -> None:
    """ "alice" is bound under "team" and known to the end only as the parent of "kid":
    once "kid" goes, nothing holds "alice", its binding goes with it and its chain is
    itself alone, though no event of its own layer says so; the sidecar names it in the
    event's `rebound_scopes`, so neither its own kept answers (a fresh client's assembly)
    nor the local cache serve "team"'s section on (before, both did)."""
    await (await owner.scope("team")).section("parent", 5, "team's")
    kid = await owner.scope("kid", parent="alice")
    await (await owner.scope("alice", parent="team")).dispose()
    await eventually(lambda: kept(sidecar, cache, "alice"), "a kept answer")
    assert "parent" in section_names(await cache.assemble("alice"))
    await kid.dispose()
    assert "parent" not in section_names(await owner.assemble("alice"))
    await eventually(lambda: lacks(cache, "alice", "parent"), "the chain without its parent")


async def mark(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
) -> dsp.PromptAssembly:
    assembly.sections.append(dsp.AssembledSection("marked", "by bob"))
    return await next(assembly)


# -- a byte budget --------------------------------------------------------------------


async def test_what_is_kept_is_bounded_by_local_cache_bytes(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    """Two scopes of ~60 KB each under a 100,000-byte budget: the second pushes the first
    out (asked again); a scope larger than the whole budget is never kept."""
    owner = await connect()
    for key, size in (("a", 60_000), ("b", 60_000), ("huge", 200_000)):
        await (await owner.scope(key)).section("text", 1, key[0] * size)
    async with dsp.connect(sidecar.address, local_cache=True, local_cache_bytes=100_000) as c:
        await c.assemble("a")
        before = served(sidecar)
        await c.assemble("a")
        assert served(sidecar) == before  # kept
        await c.assemble("b")
        await c.assemble("b")
        assert served(sidecar) == before + 1  # b kept, a pushed out
        await c.assemble("a")
        assert served(sidecar) == before + 2
        await c.assemble("huge")
        await c.assemble("huge")
        assert served(sidecar) == before + 4


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "1"])
async def test_a_local_cache_bytes_that_is_no_size_is_refused(
    sidecar: Sidecar, size: object
) -> None:
    with pytest.raises(dsp.SystemPromptError) as refused:
        await dsp.connect(sidecar.address, local_cache=True, local_cache_bytes=size)  # type: ignore[arg-type]
    assert refused.value.reason == "INVALID_VALUE"
    assert "local_cache_bytes" in refused.value.message


# -- an agent that may read only its own scopes ---------------------------------------

ADMIN, AGENT = "admin-token-0123", "alice-token-4567"


@pytest.fixture
async def guarded(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    """A sidecar with an admin and an agent that may read scopes "team" and "alice"."""
    (tmp_path / "admin.token").write_text(ADMIN)
    (tmp_path / "alice.token").write_text(AGENT)
    config = (
        f'auth_token_file = "{tmp_path / "admin.token"}"\n'
        f'[[credentials]]\nname = "alice"\nrole = "agent"\n'
        f'token_file = "{tmp_path / "alice.token"}"\nscopes = ["team", "alice"]\n'
    )
    return await make_sidecar(**tomllib.loads(config))


async def test_an_agent_listing_its_scopes_keeps_answers_watching_each(guarded: Sidecar) -> None:
    """Its watch of every change is PERMISSION_DENIED; the cache then watches each scope it
    assembles, filtered to that scope's chain: answers are kept, a change of the parent
    reaches them, and a scope it may not read is refused as before."""
    async with dsp.connect(guarded.address, token=ADMIN) as admin:
        team = await admin.scope("team")
        await (await admin.scope("alice", parent="team")).section("rules", 10, "alice's")
        await (await admin.scope("bob")).section("rules", 10, "bob's")
        async with dsp.connect(guarded.address, token=AGENT, local_cache=True) as agent:
            await eventually(lambda: kept(guarded, agent, "alice"), "a kept answer")
            await team.section("parent", 5, "team's")
            await eventually(lambda: sees(agent, "alice", "parent"), "the parent's change")
            await eventually(lambda: kept(guarded, agent, "alice"), "kept again")
            with pytest.raises(dsp.SystemPromptError) as refused:
                await agent.assemble("bob")
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


async def test_a_global_step_made_outside_an_agents_scopes_reaches_its_kept_answer(
    guarded: Sidecar,
) -> None:
    """A listener registered with `global` in bob's scope runs for alice's assemblies: the
    agent's watch of alice's chain is told of it, so the answer it kept goes (before, the
    filtered watch never got the event and the answer without the listener was served on)."""
    async with dsp.connect(guarded.address, token=ADMIN) as admin:
        await admin.scope("team")
        await (await admin.scope("alice", parent="team")).section("rules", 10, "alice's")
        bob = await admin.scope("bob")
        async with dsp.connect(guarded.address, token=AGENT, local_cache=True) as agent:
            await eventually(lambda: kept(guarded, agent, "alice"), "a kept answer")
            await bob.on_assemble(mark, global_=True)
            await eventually(lambda: sees(agent, "alice", "marked"), "the global listener")


async def test_a_scope_forgotten_with_its_parent_is_not_served_to_an_agent_watching_it(
    guarded: Sidecar,
) -> None:
    """The same through an agent's watch of alice's chain: the event is of kid's layer,
    which the filter does not keep, but it re-bound alice, which it does."""
    async with (
        dsp.connect(guarded.address, token=ADMIN) as admin,
        dsp.connect(guarded.address, token=AGENT, local_cache=True) as agent,
    ):
        await forgets_its_parent(guarded, admin, agent)


async def kept(sidecar: Sidecar, client: dsp.Client, scope: str) -> bool:
    """Whether `scope`'s next assemble() is answered without a call."""
    await client.assemble(scope)
    before = served(sidecar)
    await client.assemble(scope)
    return served(sidecar) == before


async def sees(client: dsp.Client, scope: str, name: str) -> bool:
    return name in section_names(await client.assemble(scope))


async def lacks(client: dsp.Client, scope: str, name: str) -> bool:
    return not await sees(client, scope, name)
