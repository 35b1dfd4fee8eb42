"""Change batches: a watcher that asks for them gets a burst of changes in one message."""

from __future__ import annotations

import asyncio

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, eventually, raw_channel, raw_stub

BATCHES = "change-batches"


def register(sidecar: Sidecar, count: int, prefix: str = "s") -> None:
    """`count` changes at once, as a burst of registrations would make them."""
    for index in range(count):
        sidecar.registry.register_section("someone", None, f"{prefix}{index}", index, "x")


async def read(call: grpc.aio.UnaryStreamCall, count: int) -> list[pb.WatchChangesResponse]:
    return [await asyncio.wait_for(call.read(), 5) for _ in range(count)]


async def test_a_burst_of_changes_comes_in_one_batch_to_a_watcher_that_asks_for_batches(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(watch_coalesce_s=0.05)
    async with raw_channel(sidecar.address) as channel:
        call = raw_stub(channel).WatchChanges(pb.WatchChangesRequest(features=[BATCHES, "nope"]))
        (subscribed,) = await read(call, 1)
        register(sidecar, 5)
        (message,) = await read(call, 1)
        call.cancel()
    assert list(subscribed.subscribed.features) == [BATCHES]
    assert message.WhichOneof("kind") == "batch"
    assert [event.name for event in message.batch.events] == ["s0", "s1", "s2", "s3", "s4"]
    assert message.incarnation == subscribed.incarnation


async def test_a_watcher_that_does_not_ask_for_batches_gets_one_event_per_message(
    sidecar: Sidecar,
) -> None:
    async with raw_channel(sidecar.address) as channel:
        call = raw_stub(channel).WatchChanges(pb.WatchChangesRequest())
        (subscribed,) = await read(call, 1)
        register(sidecar, 3)
        messages = await read(call, 3)
        call.cancel()
    assert list(subscribed.subscribed.features) == []
    assert [message.WhichOneof("kind") for message in messages] == ["event"] * 3
    assert [message.event.name for message in messages] == ["s0", "s1", "s2"]


async def test_a_watcher_more_than_its_buffer_behind_is_told_at_once_then_reads_on(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(watch_buffer=3, watch_coalesce_s=0)
    async with raw_channel(sidecar.address) as channel:
        call = raw_stub(channel).WatchChanges(pb.WatchChangesRequest(features=[BATCHES]))
        (subscribed,) = await read(call, 1)
        start = subscribed.subscribed.revision
        register(sidecar, 10)
        (batch,) = await read(call, 1)
        register(sidecar, 1, "after")
        (after,) = await read(call, 1)
        call.cancel()
    assert not batch.batch.events  # none of the 10 it had not read: they are all in the gap
    gap = batch.batch.missed
    told = (gap.first_missed_revision - start, gap.count, gap.resync_revision - start)
    assert told == (1, 10, 10)
    assert [event.name for event in after.batch.events] == ["after0"]


async def test_a_watcher_that_stops_reading_holds_up_no_other_watcher(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=30, watch_buffer=100_000)
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own: its own window
    async with (
        raw_channel(sidecar.address) as channel,
        grpc.aio.insecure_channel(sidecar.address, options=own) as other,
    ):
        stuck = raw_stub(channel).WatchChanges(pb.WatchChangesRequest(features=[BATCHES]))
        await stuck.read()  # subscribed; from here on it reads nothing
        reader = raw_stub(other).WatchChanges(pb.WatchChangesRequest(features=[BATCHES]))
        await reader.read()
        seen = [0]

        async def read_all() -> None:
            while True:
                message = await reader.read()
                assert isinstance(message, pb.WatchChangesResponse)
                seen[0] += len(message.batch.events)

        reading = asyncio.create_task(read_all())
        name = "n" * 250
        registry = sidecar.registry
        for index in range(40):  # 5 MiB of events: more than the stuck stream's window
            for pair in range(250):
                entry = registry.register_section("someone", None, f"{name}{pair}", pair, "x")
                registry.dispose("someone", entry.id)
            expected = 500 * (index + 1)
            await eventually(lambda: seen[0] == expected, "the reader has all", 10)  # noqa: B023
        assert sidecar.registry.changes.subscriber_count() == 2  # the stuck one is still open
        reading.cancel()
        stuck.cancel()


async def test_a_watcher_without_batches_gets_a_burst_in_a_few_write_turns_not_one_each(
    sidecar: Sidecar,
) -> None:
    async with raw_channel(sidecar.address) as channel:
        call = raw_stub(channel).WatchChanges(pb.WatchChangesRequest())
        await read(call, 1)  # subscribed
        turns = sidecar.state.watches.turns
        before = turns.taken
        register(sidecar, 200)
        events = await read(call, 200)
    assert [e.event.name for e in events] == [f"s{index}" for index in range(200)]
    assert turns.taken - before < 100  # one turn per event queued behind every other watcher
