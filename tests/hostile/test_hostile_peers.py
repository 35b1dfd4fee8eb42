"""Peers that stop reading, hold on or pile up cost only themselves."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import BUILTIN_SECTIONS, SidecarFactory, eventually, metric

BIG = "x" * (250 * 1024)


async def _open_session(stub: pb_grpc.SystemPromptServiceStub) -> tuple[object, str]:
    stream = stub.OpenSession()
    await stream.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="t")))
    return stream, (await stream.read()).opened.session_id


@contextlib.asynccontextmanager
async def _big_session(
    sidecar: Sidecar, sections: int
) -> AsyncIterator[tuple[pb_grpc.SystemPromptServiceStub, str]]:
    """A session on a channel of its own, with `sections` sections of 250 KiB."""
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session, session_id = await _open_session(stub)
        for index in range(sections):
            await stub.RegisterSection(
                pb.RegisterSectionRequest(session_id=session_id, name=f"big{index}", text=BIG)
            )
        try:
            yield stub, session_id
        finally:
            session.cancel()  # type: ignore[attr-defined]


async def _listening(stub: pb_grpc.SystemPromptServiceStub, session_id: str) -> Any:
    """A listener stream of the session, installed (its confirmation read)."""
    listener = stub.Listen()
    await listener.write(pb.ListenRequest(start=pb.ListenStart(session_id=session_id)))
    await listener.read()
    return listener


async def test_a_listener_that_stops_reading_is_dropped_and_assemblies_answer(
    make_sidecar: SidecarFactory,
) -> None:
    # not ejected for its timeouts (that is test_hostile_ejection's): closed for not reading,
    # then away (its assemblies fail LISTENER_UNAVAILABLE) until its owner's dead-peer
    # bound passes without it coming back, and gone
    sidecar = await make_sidecar(
        provider_timeout_s=1, eject_after_timeouts=0, dead_peer_timeout_s=1.0
    )
    async with _big_session(sidecar, 12) as (stub, session_id):  # 3 MiB an invocation
        listener = await _listening(stub, session_id)  # from here on it reads nothing
        outcomes = []
        # by the clock, not a count of tries: on a loaded host the first refusals come slowly
        give_up = asyncio.get_running_loop().time() + 20
        while asyncio.get_running_loop().time() < give_up:
            try:
                await stub.Assemble(pb.AssembleRequest(), timeout=5)
                outcomes.append("ok")
            except grpc.aio.AioRpcError as error:
                trailers = dict(error.trailing_metadata() or ())
                outcomes.append(str(trailers.get("dsh-error-reason", error.code())))
            if outcomes[-1] == "ok":
                break
            await asyncio.sleep(0.2)
        listener.cancel()
    assert set(outcomes) <= {"ok", "LISTENER_TIMEOUT", "LISTENER_UNAVAILABLE"}
    assert outcomes[-1] == "ok"
    assert _stalled(sidecar, "listener") == 1


def _stalled(sidecar: Sidecar, kind: str) -> float:
    return metric(sidecar, "dsp_stalled_peers_total", kind=kind)


async def test_a_session_that_stops_reading_is_closed_before_its_outbox_outgrows_the_bound(
    make_sidecar: SidecarFactory,
) -> None:
    # what is queued stays under the bound (past it, requests wait for room within their
    # assembly's time), and the session is closed once a write waits its write timeout
    limits = {"max_outbox_bytes": 1 << 20, "max_fields_bytes": 1 << 20}
    sidecar = await make_sidecar(provider_timeout_s=2, limits=limits)
    fields = json.dumps({"blob": "y" * (256 * 1024)})
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session, session_id = await _open_session(stub)
        dynamic = pb.Dynamic(provider_key="p")
        await stub.RegisterSection(
            pb.RegisterSectionRequest(session_id=session_id, name="d", dynamic=dynamic)
        )
        context = pb.AssembleContext(fields_json=fields)
        for _ in range(100):  # each asks the session, which reads nothing
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Assemble(pb.AssembleRequest(context=context), timeout=0.2)
            if not len(sidecar.state.sessions):
                break
        reply = await stub.Assemble(pb.AssembleRequest(context=context), timeout=5)
        session.cancel()
    assert len(sidecar.state.sessions) == 0
    assert [s.name for s in reply.assembly.sections] == list(BUILTIN_SECTIONS)
    assert _stalled(sidecar, "session") == 1


async def test_a_watcher_that_stops_reading_is_closed_and_frees_its_slot(
    make_sidecar: SidecarFactory,
) -> None:
    # Neither its buffer nor its lag tells it it missed events (a watcher told so has none
    # left to send until the next change): its writes fill the stream's window and stall.
    sidecar = await make_sidecar(provider_timeout_s=1, watch_buffer=100_000, watch_lag_s=0)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        watcher = pb_grpc.SystemPromptServiceStub(channel).WatchChanges(pb.WatchChangesRequest())
        await watcher.read()  # subscribed; from here on it reads nothing
        registry, name = sidecar.registry, "n" * 250
        for index in range(8000):  # about 4 MiB of events: more than the stream's window
            entry = registry.register_section("someone", None, f"{name}{index}", 1, "x")
            registry.dispose("someone", entry.id)
            if index % 100 == 0:
                await asyncio.sleep(0)  # let the watcher's writes start
        await eventually(lambda: registry.changes.subscriber_count() == 0, "closed", 10)
        watcher.cancel()
    assert _stalled(sidecar, "watcher") == 1


async def test_a_listing_that_stops_reading_is_closed_and_holds_no_more_batches(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=1)
    async with _big_session(sidecar, 64) as (stub, _):  # 16 batches, more than the window
        listing = stub.ListRegistrations(pb.ListRegistrationsRequest(include_values=True))
        await listing.read()  # one batch; from here on it reads nothing
        await eventually(lambda: _stalled(sidecar, "listing") == 1, "listing closed", 20)
        received = 1
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await listing.read() is not grpc.aio.EOF:
                received += 1  # what was already on its way
        code, details = await listing.code(), await listing.details()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the listing was closed: it did not read a message within 1s" in (details or "")
    assert received < 16


async def test_a_listener_slow_to_read_invocations_whose_assemblies_gave_up_still_answers(
    make_sidecar: SidecarFactory,
) -> None:
    # Invocations are still being written when their assemblies' deadline passes: the
    # writes must go on (a write cancelled half-sent fails the stream's next one, and so
    # do two at once), not end the stream. The outbox's bound is raised past the five
    # invocations' 15 MiB, which this test is not about (when they are queued is a race).
    sidecar = await make_sidecar(provider_timeout_s=10, limits={"max_outbox_bytes": 64 * 2**20})
    async with _big_session(sidecar, 12) as (stub, session_id):  # 3 MiB an invocation
        listener = await _listening(stub, session_id)  # its invocations left unread for now
        given_up = await asyncio.gather(
            *(stub.Assemble(pb.AssembleRequest(), timeout=0.5) for _ in range(4)),
            return_exceptions=True,
        )
        answered = asyncio.ensure_future(stub.Assemble(pb.AssembleRequest(), timeout=10))
        read: list[tuple[str, int]] = []
        while not answered.done():  # the given-up invocations and their cancels, then the next
            message = await listener.read()
            kind = message.WhichOneof("kind")
            read.append((kind, getattr(message, kind).invocation_id))
            if read[-1] == ("invocation", 5):
                result = pb.ListenerResult(invocation_id=5, assembly=message.invocation.assembly)
                await listener.write(pb.ListenRequest(result=result))
                break
        reply = await answered
        listener.cancel()
    assert [type(error) for error in given_up] == [grpc.aio.AioRpcError] * 4
    assert {error.code() for error in given_up} == {grpc.StatusCode.DEADLINE_EXCEEDED}
    assert sorted(read) == [("cancel", i) for i in range(1, 5)] + [
        ("invocation", i) for i in range(1, 6)
    ]
    assert len(reply.assembly.sections) == len(BUILTIN_SECTIONS) + 12
    assert _stalled(sidecar, "listener") == 0
