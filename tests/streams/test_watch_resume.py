"""Resumable, filtered watches: replay from history, resync from a listing, incarnations."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp
import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import (
    ClientFactory,
    SidecarFactory,
    eventually,
    next_events,
    raw_channel,
    raw_stub,
    scope_tree,
)
from processes import free_port, serve

View = dict[str, tuple[str, str, str | None, str]]


def view_of(snapshot: dsp.Snapshot) -> View:
    return {i.ref: (i.kind, i.name, i.scope, i.fingerprint) for i in snapshot.registrations}


def apply(view: View, event: dsp.ChangeEvent) -> None:
    if event.action == "unregistered":
        del view[event.ref]
    else:
        view[event.ref] = (event.kind, event.name, event.scope, event.fingerprint)


async def follow(changes: dsp.ChangeStream, view: View, until: int) -> list[str]:
    """Apply what `changes` yields to `view` until it reaches revision `until`; the kinds seen."""
    seen: list[str] = []
    while changes.last_revision < until:
        item = await asyncio.wait_for(anext(changes), 10)
        seen.append(type(item).__name__)
        if isinstance(item, dsp.ChangesResynced):
            view.clear()
            view.update(view_of(item.snapshot))
        else:
            assert isinstance(item, dsp.ChangeEvent), item
            apply(view, item)
    return seen


async def churn(client: dsp.Client, prefix: str, count: int) -> None:
    """Registrations, updates and disposals: every kind of change."""
    for index in range(count):
        handle = await client.section(f"{prefix}{index}", index, "first")
        await handle.update("second")
        if index % 2:
            await handle()


async def test_a_watcher_that_disconnects_resumes_without_missing_or_duplicating(
    connect: ClientFactory,
) -> None:
    watcher, owner = await connect(), await connect()
    changes = await watcher.watch_changes()
    await churn(owner, "before-", 2)
    seen = await next_events(changes, 5)
    await changes.close()
    await churn(owner, "while-away-", 3)  # 7 changes nobody reads
    resumed = await watcher.watch_changes(
        after_revision=changes.last_revision, incarnation=changes.incarnation
    )
    await owner.section("after", 1, "x")
    later = await next_events(resumed, 8)
    revisions = [event.revision for event in seen + later]
    assert revisions == list(range(revisions[0], revisions[0] + 13))
    assert [e.name for e in later[:2]] == ["while-away-0", "while-away-0"]
    assert later[-1].name == "after"


async def test_every_response_carries_the_incarnation_of_the_sidecar(
    make_sidecar: SidecarFactory, client: dsp.Client, sidecar: Sidecar
) -> None:
    other: Sidecar = await make_sidecar()
    incarnations = []
    for each in (sidecar, other):
        async with raw_channel(each.address) as channel:
            call = raw_stub(channel).WatchChanges(pb.WatchChangesRequest())
            first = await call.read()
            if each is sidecar:
                await client.section("one", 1, "x")
                event = await call.read()
                assert event.incarnation == first.incarnation == first.subscribed.incarnation
            incarnations.append(first.incarnation)
            call.cancel()
    assert all(incarnations) and incarnations[0] != incarnations[1]


async def test_a_watcher_behind_the_history_resyncs_to_the_view_of_a_fresh_one(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar: Sidecar = await make_sidecar(change_history=4)
    async with dsp.connect(sidecar.address) as owner, dsp.connect(sidecar.address) as watcher:
        await churn(owner, "kept-", 3)
        changes = await watcher.watch_changes()
        last, incarnation = changes.last_revision, changes.incarnation
        await changes.close()
        watchers = sidecar.registry.changes.subscriber_count
        await eventually(lambda: watchers() == 0, "the closed watch ends")
        await churn(owner, "missed-", 4)  # 10 changes: more than the history holds
        resumed = await watcher.watch_changes(after_revision=last, incarnation=incarnation)
        view: View = {}
        await churn(owner, "after-", 2)
        seen = await follow(resumed, view, sidecar.registry.revision)
        fresh = await watcher.snapshot()
    assert seen[0] == "ChangesResynced" and "ChangesResynced" not in seen[1:]
    assert view == view_of(fresh)


async def test_resuming_from_another_incarnation_resyncs_as_restarted(
    client: dsp.Client,
) -> None:
    await client.section("one", 1, "x")
    changes = await client.watch_changes(after_revision=1, incarnation="an-older-process")
    item = await asyncio.wait_for(anext(changes), 5)
    assert isinstance(item, dsp.ChangesResynced) and item.reason == "restarted"
    assert "one" in {info.name for info in item.snapshot.registrations}


async def test_a_watch_across_a_sidecar_restart_resyncs_to_the_view_of_a_fresh_one() -> None:
    address = f"127.0.0.1:{free_port()}"
    async with (
        serve("--listen", address) as first,
        dsp.connect(address) as owner,
        dsp.connect(address) as watcher,
    ):
        scope = await owner.scope("agent-1")
        memory = await scope.section("memory", 1, "nothing yet")
        changes = await watcher.watch_changes()
        before = changes.incarnation
        first.process.kill()
        await first.process.wait()
        async with serve("--listen", address):
            await eventually(lambda: owner.connected, "the owner replays", timeout=20)
            await memory.update("tea")
            view: View = {}
            fresh = await watcher_snapshot_when_ready(watcher)
            seen = await follow(changes, view, fresh.revision)
            fresh = await watcher.snapshot()
        await changes.close()
    assert "ChangesResynced" in seen and changes.incarnation != before
    assert view == view_of(fresh)


async def watcher_snapshot_when_ready(client: dsp.Client) -> dsp.Snapshot:
    await eventually(lambda: client.connected, "the watcher's client reconnects", timeout=20)
    return await client.snapshot()


async def test_a_scope_filter_delivers_its_layer_and_with_ancestors_its_chain(
    client: dsp.Client,
) -> None:
    team, agent, other = await scope_tree(client)
    own = await client.watch_changes("agent-1")
    chain = await client.watch_changes("agent-1", ancestors=True, kinds=["section", "variable"])
    for registrar in (client, team, agent, other):
        await registrar.variable("v", "x")
    await agent.suppress_runtime_context()
    own_events = await next_events(own, 2)
    chain_events = await next_events(chain, 3)
    assert [(e.kind, e.scope) for e in own_events] == [
        ("variable", "agent-1"),
        ("suppressor", "agent-1"),
    ]
    assert [e.scope for e in chain_events] == [None, "team", "agent-1"]


async def test_a_scope_filter_with_ancestors_delivers_a_global_step_made_in_another_scope(
    client: dsp.Client,
) -> None:
    """A listener registered with `global` in agent-2's layer runs for agent-1's assemblies
    too: agent-1's chain watch gets its event (as a local cache following the chain must);
    a listener of agent-2's layer alone, which agent-1's assemblies never run, it does not,
    nor does the watch of agent-1's layer alone."""
    _, agent, other = await scope_tree(client)
    chain = await client.watch_changes("agent-1", ancestors=True)
    own = await client.watch_changes("agent-1")

    async def passing(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
    ) -> dsp.PromptAssembly:
        return await next(assembly)

    await other.on_assemble(passing, name="scoped")
    await other.on_assemble(passing, global_=True, name="everywhere")
    await client.variable("end", "x")  # the global layer's: the last event either watch gets
    events = await next_events(chain, 2)
    assert [(e.kind, e.name, e.scope) for e in events] == [
        ("listener", "everywhere", "agent-2"),
        ("variable", "end", None),
    ]
    await agent.variable("own_end", "x")  # agent-1's layer: the first event its own watch gets
    assert [(e.kind, e.name) for e in await next_events(own, 1)] == [("variable", "own_end")]


async def test_watches_per_connection_are_bounded(make_sidecar: SidecarFactory) -> None:
    sidecar: Sidecar = await make_sidecar(limits={"max_watchers_per_peer": 2})
    async with dsp.connect(sidecar.address) as client:
        one = await client.watch_changes()
        prompts = await client.watch_prompt("agent-1")
        await asyncio.wait_for(anext(prompts), 10)  # admitted once it answers
        try:
            await client.watch_changes()
        except dsp.SystemPromptError as error:
            assert (error.code, error.reason) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                dsp.Reason.QUOTA_EXCEEDED,
            )
            assert "limits.max_watchers_per_peer" in error.message
        else:
            raise AssertionError("a third watch on one connection was accepted")
        await one.close()
        await eventually(
            lambda: sidecar.registry.changes.subscriber_count() == 1, "the closed watch ends"
        )
        await client.watch_changes()  # the freed place is taken again
