"""Watchers that keep up are never slowed by those that cannot: a write turn is bounded by
bytes and time, not messages; writers with a backlog queue apart from those that keep up;
and a watcher more than its buffer or its lag behind is told at once (ChangesMissed),
while a batching watcher beside it keeps every event. The turns are checked on Turns
itself with real asyncio tasks, the rest through a sidecar's WatchChanges streams; what
it is worth beside 900 plain watchers is bench/figures/watches.py's beside_plain_watchers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import dsh_system_prompt as dsp
import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.rpc.streams.turns import TURN_BYTES, Turns
from helpers import SidecarFactory, eventually, raw_stub

# A connection of its own, whose windows do not grow (no BDP probing): a stream that is not
# read takes its first 64 KiB, no more.
OWN = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)]
NAME = 16 * 1024  # big events: a few fill a stream's window
EVENTS = 400


async def test_a_turn_starts_no_further_message_once_it_wrote_its_bytes() -> None:
    turns = Turns(lease_s=60, turn_s=60)
    turn = await turns.take()
    turn.spent(TURN_BYTES - 1)
    assert not turn.over
    turn.spent(1)
    assert turn.over
    turn.done()


async def test_a_turn_runs_out_of_time_only_while_another_writer_waits() -> None:
    turns = Turns(lease_s=60, turn_s=0)  # its time is up at once
    turn = await turns.take()
    assert not turn.over  # alone: its lease bounds it
    waiting = asyncio.create_task(turns.take())
    await asyncio.sleep(0)
    assert turn.over
    turn.done()
    (await waiting).done()


async def test_a_writer_that_keeps_up_waits_for_one_backlog_turn_not_one_of_each() -> None:
    turns = Turns(lease_s=60)
    holder = await turns.take()
    order: list[str] = []

    async def write(name: str, behind: bool) -> None:
        turn = await turns.take(behind=behind)
        order.append(name)
        turn.done()

    tasks = [asyncio.create_task(write(f"behind {index}", True)) for index in range(3)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(write("keeps up", False)))
    await asyncio.sleep(0)
    holder.done()
    await asyncio.gather(*tasks)
    assert order == ["behind 0", "keeps up", "behind 1", "behind 2"]


async def _bursting(make_sidecar: SidecarFactory, watch_buffer: int, watch_lag_s: float) -> Sidecar:
    """A sidecar whose watches have this buffer and lag, with room for _burst's big names."""
    return await make_sidecar(
        watch_buffer=watch_buffer,
        watch_lag_s=watch_lag_s,
        provider_timeout_s=60,
        limits={"max_name_bytes": NAME, "max_message_bytes": 64 << 20},
    )


async def _burst(sidecar: Sidecar, seen: Sequence[object] | None = None) -> None:
    """EVENTS registrations of big names, 20 at a time; each 20 once `seen` has the 20
    before (a watcher that keeps up, even on a loaded machine), else after a yield."""
    for index in range(EVENTS):
        sidecar.registry.register_section("someone", None, f"{index:04d}".ljust(NAME, "x"), 1, "")
        if index % 20 == 19:
            await asyncio.sleep(0)
            if seen is not None:
                await eventually(lambda: len(seen) > index, "the batching watcher keeps up", 10)  # noqa: B023


async def _read_to(call: grpc.aio.UnaryStreamCall, last: int) -> list[pb.WatchChangesResponse]:
    """What a plain watcher that did not read reads now, up to revision `last`."""
    read: list[pb.WatchChangesResponse] = []
    reached = 0
    while reached < last:
        message = await asyncio.wait_for(call.read(), 10)
        assert isinstance(message, pb.WatchChangesResponse)
        read.append(message)
        kind = message.WhichOneof("kind")
        reached = message.event.revision if kind == "event" else message.missed.resync_revision
    return read


async def _slow_plain_beside_a_batching_watcher(
    sidecar: Sidecar,
) -> tuple[list[pb.WatchChangesResponse], list[dsp.ChangeEvent | dsp.ChangesMissed], int]:
    """A plain watcher that reads nothing during a burst, and a batching one (the Python
    client's) that reads all along: what each read of it."""
    async with (
        grpc.aio.insecure_channel(sidecar.address, options=OWN) as channel,
        dsp.connect(sidecar.address) as client,
    ):
        plain = raw_stub(channel).WatchChanges(pb.WatchChangesRequest())
        start = (await plain.read()).subscribed.revision  # type: ignore[union-attr]
        batched = await client.watch_changes()
        seen: list[dsp.ChangeEvent | dsp.ChangesMissed] = []

        async def read_batched() -> None:
            async for item in batched:
                assert not isinstance(item, dsp.ChangesResynced)
                seen.append(item)

        reading = asyncio.create_task(read_batched())
        await _burst(sidecar, seen)
        last = sidecar.registry.revision
        await eventually(lambda: len(seen) == EVENTS, "the batching watcher has every event", 30)
        read = await _read_to(plain, last)
        reading.cancel()
        plain.cancel()
    assert last - start == EVENTS
    return read, seen, start


async def test_a_plain_watcher_past_its_buffer_is_told_while_a_batching_one_keeps_every_event(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await _bursting(make_sidecar, watch_buffer=64, watch_lag_s=0)
    read, seen, start = await _slow_plain_beside_a_batching_watcher(sidecar)
    assert all(isinstance(item, dsp.ChangeEvent) for item in seen)
    assert [item.revision - start for item in seen] == list(range(1, EVENTS + 1))
    events = [message.event for message in read if message.WhichOneof("kind") == "event"]
    gaps = [message.missed for message in read if message.WhichOneof("kind") == "missed"]
    # What its stream's window took before it read anything (6 events here), then at once the
    # rest as a gap, none of the 64 its buffer held first (before, its turn had taken up to
    # 512 events off its buffer: it was sent those it had taken and its buffer's 64, 84 here,
    # then told).
    assert gaps, "the plain watcher should have been told it missed events"
    assert len(events) + sum(gap.count for gap in gaps) == EVENTS
    assert 0 < len(events) < 64


async def test_a_plain_watcher_whose_events_waited_past_its_lag_is_told(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await _bursting(make_sidecar, watch_buffer=100_000, watch_lag_s=0.2)
    async with grpc.aio.insecure_channel(sidecar.address, options=OWN) as channel:
        plain = raw_stub(channel).WatchChanges(pb.WatchChangesRequest())
        await plain.read()  # subscribed; from here on it reads nothing for a while
        await _burst(sidecar)
        last = sidecar.registry.revision
        await asyncio.sleep(0.5)  # the events its window did not take wait past 0.2 s
        read = await _read_to(plain, last)
        plain.cancel()
    kinds = [message.WhichOneof("kind") for message in read]
    assert "missed" in kinds, "the plain watcher should have been told it missed events"
    gap = read[kinds.index("missed")].missed
    assert sum(kind == "event" for kind in kinds) + gap.count == EVENTS
    assert gap.resync_revision == last  # every event it had not been sent: none was buffered
