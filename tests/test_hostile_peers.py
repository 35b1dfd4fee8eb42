"""Peers that stop reading, hold on or pile up cost only themselves."""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import BUILTIN_SECTIONS, SidecarFactory, eventually

BIG = "x" * (250 * 1024)


async def _open_session(stub: pb_grpc.SystemPromptServiceStub) -> tuple[object, str]:
    stream = stub.OpenSession()
    await stream.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="t")))
    return stream, (await stream.read()).opened.session_id


async def test_a_listener_that_stops_reading_is_dropped_and_assemblies_answer(
    make_sidecar: SidecarFactory,
) -> None:
    # not ejected for its timeouts (that is test_hostile_ejection's): closed for not reading
    sidecar = await make_sidecar(provider_timeout_s=1, eject_after_timeouts=0)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session, session_id = await _open_session(stub)
        for index in range(12):  # 3 MiB an invocation: a few fill the stream's window
            await stub.RegisterSection(
                pb.RegisterSectionRequest(session_id=session_id, name=f"big{index}", text=BIG)
            )
        listener = stub.Listen()
        await listener.write(pb.ListenRequest(start=pb.ListenStart(session_id=session_id)))
        await listener.read()  # registered; from here on it reads nothing
        outcomes = []
        for _ in range(6):
            try:
                await stub.Assemble(pb.AssembleRequest(), timeout=5)
                outcomes.append("ok")
            except grpc.aio.AioRpcError as error:
                trailers = dict(error.trailing_metadata() or ())
                outcomes.append(str(trailers.get("dsh-error-reason", error.code())))
        listener.cancel()
        session.cancel()
    assert set(outcomes) <= {"ok", "LISTENER_TIMEOUT"}
    assert outcomes[-1] == "ok"
    assert _stalled(sidecar, "listener") == 1


def _stalled(sidecar: Sidecar, kind: str) -> float:
    value = sidecar.metrics.registry.get_sample_value("dsp_stalled_peers_total", {"kind": kind})
    return value or 0.0


async def test_a_session_that_stops_reading_is_closed_before_its_outbox_outgrows_the_bound(
    make_sidecar: SidecarFactory,
) -> None:
    limits = {"max_outbox_bytes": 1 << 20, "max_fields_bytes": 1 << 20}
    sidecar = await make_sidecar(provider_timeout_s=30, limits=limits)
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
    sidecar = await make_sidecar(provider_timeout_s=1, watch_buffer=100_000)
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
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session, session_id = await _open_session(stub)
        for index in range(64):  # 16 MiB of values: 16 batches, more than the stream's window
            await stub.RegisterSection(
                pb.RegisterSectionRequest(session_id=session_id, name=f"big{index}", text=BIG)
            )
        listing = stub.ListRegistrations(pb.ListRegistrationsRequest(include_values=True))
        await listing.read()  # one batch; from here on it reads nothing
        await eventually(lambda: _stalled(sidecar, "listing") == 1, "listing closed", 20)
        received = 1
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await listing.read() is not grpc.aio.EOF:
                received += 1  # what was already on its way
        code, details = await listing.code(), await listing.details()
        session.cancel()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the listing was closed: it did not read a message within 1s" in (details or "")
    assert received < 16
