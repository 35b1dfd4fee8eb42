"""The client's change streams against a scripted sidecar that misbehaves: silence, gaps,
batches, events out of order, a stream ended under it."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from helpers import eventually
from scripted import (
    End,
    ScriptedSidecar,
    Silent,
    connect,
    failing,
)

grpc_max_workers = 32  # pytest-grpc: each open stream of the scripted sidecar holds a thread


# -- change events --------------------------------------------------------------------


def change(revision: int) -> pb.WatchChangesResponse:
    event = pb.ChangeEvent(
        revision=revision,
        kind=pb.CHANGE_KIND_SECTION,
        action=pb.CHANGE_ACTION_REGISTERED,
        name=f"s{revision}",
    )
    return pb.WatchChangesResponse(event=event)


def missed(first: int, count: int, resync: int) -> pb.WatchChangesResponse:
    gap = pb.ChangesMissed(first_missed_revision=first, count=count, resync_revision=resync)
    return pb.WatchChangesResponse(missed=gap)


async def test_a_change_stream_the_sidecar_never_confirms_fails_within_the_call_timeout(
    scripted: ScriptedSidecar,
) -> None:
    error = await failing(scripted, Silent("watch"), lambda c: c.watch_changes())
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "SIDECAR_UNAVAILABLE")


async def test_events_after_a_changes_missed_resume_past_its_resync_revision(
    scripted: ScriptedSidecar,
) -> None:
    async with connect(scripted) as client:
        changes = await client.watch_changes()
        for message in (change(11), missed(12, 3, 14), change(15)):
            scripted.script.watchers[0].outbox.put(message)
        seen = [await asyncio.wait_for(anext(changes), 5) for _ in range(3)]
        await changes.close()
    assert [type(item).__name__ for item in seen] == ["ChangeEvent", "ChangesMissed", "ChangeEvent"]
    assert seen[1] == dsp.ChangesMissed(12, 3, 14)


async def test_a_change_batch_is_yielded_event_by_event_then_its_gap(
    scripted: ScriptedSidecar,
) -> None:
    events = [change(revision).event for revision in (11, 12, 13)]
    gap = missed(14, 2, 15).missed
    async with connect(scripted) as client:
        changes = await client.watch_changes()
        batch = pb.ChangeBatch(events=events, missed=gap)
        scripted.script.watchers[0].outbox.put(pb.WatchChangesResponse(batch=batch))
        scripted.script.watchers[0].outbox.put(change(16))
        seen = [await asyncio.wait_for(anext(changes), 5) for _ in range(5)]
        await changes.close()
    assert list(scripted.script.watch_requests[0].features) == ["change-batches"]
    assert [getattr(item, "revision", None) for item in seen] == [11, 12, 13, None, 16]
    assert seen[3] == dsp.ChangesMissed(14, 2, 15)
    assert changes.last_revision == 16


@pytest.mark.parametrize(
    "wrong",
    [
        [change(11), change(11)],
        [change(12), change(11)],
        [change(9)],
        [change(11), missed(11, 1, 11)],
        [missed(11, 2, 10)],
        [change(11), pb.WatchChangesResponse(subscribed=pb.WatchSubscribed(revision=1))],
    ],
    ids=[
        "repeated",
        "backwards",
        "before-the-subscription",
        "gap-over-a-delivered-event",
        "gap-ending-before-it-starts",
        "subscribed-again",
    ],
)
async def test_change_events_out_of_order_raise_a_protocol_error_and_end_the_stream(
    scripted: ScriptedSidecar, wrong: list[pb.WatchChangesResponse]
) -> None:
    async with connect(scripted) as client:
        changes = await client.watch_changes()
        for message in wrong:
            scripted.script.watchers[0].outbox.put(message)
        with pytest.raises(dsp.SystemPromptError) as failure:
            for _ in wrong:
                await asyncio.wait_for(anext(changes), 5)
        assert failure.value.reason == "PROTOCOL_ERROR"
        await asyncio.to_thread(scripted.script.watchers[0].ended.wait, 5)
        assert scripted.script.watchers[0].ended.is_set()


@pytest.mark.parametrize(
    "end", [End(), End(grpc.StatusCode.UNAVAILABLE, "restarting")], ids=["ok", "restart"]
)
async def test_a_change_stream_the_sidecar_ends_resumes_after_the_last_event_delivered(
    scripted: ScriptedSidecar, end: End
) -> None:
    async with connect(scripted) as client:
        changes = await client.watch_changes()
        scripted.script.watchers[0].outbox.put(change(11))
        scripted.script.watchers[0].outbox.put(end)
        first = await asyncio.wait_for(anext(changes), 5)
        resumed = asyncio.ensure_future(anext(changes))
        await eventually(lambda: len(scripted.script.watchers) == 2, "the stream resubscribes")
        scripted.script.watchers[1].outbox.put(change(12))
        second = await asyncio.wait_for(resumed, 5)
        await changes.close()
    assert [first.revision, second.revision] == [11, 12]  # type: ignore[union-attr]
    assert scripted.script.watch_requests[1].after_revision == 11
