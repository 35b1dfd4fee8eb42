"""A listener stream that keeps reading is never closed for what others queue on it, and a
listener whose stream the sidecar closed is never silently absent (issue 34, item 3)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.rpc.streams.listeners import ListenerStream
from helpers import SidecarFactory, eventually, listener_streams, metric

MARK = "redacted-by-policy"
BIG = "x" * (100 * 1024)


@contextlib.asynccontextmanager
async def _session(sidecar: Sidecar) -> AsyncIterator[tuple[pb_grpc.SystemPromptServiceStub, str]]:
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session = stub.OpenSession()
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="t")))
        session_id = (await session.read()).opened.session_id
        try:
            yield stub, session_id
        finally:
            session.cancel()


async def _install(stub: pb_grpc.SystemPromptServiceStub, start: pb.ListenStart) -> Any:
    listener = stub.Listen()
    await listener.write(pb.ListenRequest(start=start))
    assert (await listener.read()).WhichOneof("kind") == "registered"
    return listener


async def _mark_everything(listener: Any, pace_s: float = 0.0) -> None:
    """An honest policy listener: reads every invocation and answers it, marked (after
    `pace_s`: it keeps reading, at its own pace)."""
    while (message := await listener.read()) is not grpc.aio.EOF:
        await asyncio.sleep(pace_s)
        if message.WhichOneof("kind") != "invocation":
            continue
        await _answer_marked(listener, message.invocation)


async def _answer_marked(listener: Any, invocation: pb.ListenerInvocation) -> None:
    """Answer `invocation` with its assembly, marked."""
    assembly = pb.PromptAssembly()
    assembly.CopyFrom(invocation.assembly)
    assembly.sections.add(name=MARK, text="checked")
    result = pb.ListenerResult(invocation_id=invocation.invocation_id, assembly=assembly)
    await listener.write(pb.ListenRequest(result=result))


def _reason(error: BaseException) -> str:
    assert isinstance(error, grpc.aio.AioRpcError), error
    return str(dict(error.trailing_metadata() or ()).get("dsh-error-reason", error.code()))


def _stalled(sidecar: Sidecar) -> float:
    return metric(sidecar, "dsp_stalled_peers_total", kind="listener")


async def test_a_burst_of_others_assemblies_waits_for_a_reading_listener_and_never_closes_it(
    make_sidecar: SidecarFactory,
) -> None:
    # 40 assemblies of ~400 KiB invocations at once queue ~16 MiB on a stream bounded at
    # 512 KiB, read at 20 ms an invocation: they wait for the listener's reads instead of
    # closing it (on main the stream was closed STREAM_STALLED, most of them failed, and
    # the rest went unmarked).
    sidecar = await make_sidecar(provider_timeout_s=30, limits={"max_outbox_bytes": 512 * 1024})
    async with _session(sidecar) as (stub, session_id):
        for index in range(4):
            request = pb.RegisterSectionRequest(session_id=session_id, name=f"b{index}", text=BIG)
            await stub.RegisterSection(request)
        start = pb.ListenStart(session_id=session_id, name="policy")
        setattr(start, "global", True)
        listener = await _install(stub, start)
        marking = asyncio.ensure_future(_mark_everything(listener, pace_s=0.02))
        replies = await asyncio.gather(
            *(stub.Assemble(pb.AssembleRequest(), timeout=60) for _ in range(40)),
            return_exceptions=True,
        )
        marking.cancel()
        listener.cancel()
    failures = [_reason(reply) for reply in replies if isinstance(reply, BaseException)]
    assert failures == []
    marked = [MARK in [s.name for s in reply.assembly.sections] for reply in replies]  # type: ignore[union-attr]
    assert marked == [True] * 40
    assert _stalled(sidecar) == 0


async def test_an_invocation_that_finds_no_room_in_time_fails_only_its_assembly(
    make_sidecar: SidecarFactory,
) -> None:
    # The listener reads nothing for a while (less than the write timeout): once gRPC's
    # buffers and the stream's window are full, an invocation is being written, the next
    # is queued, and the one after finds the queue at its bound and waits; past the
    # listener's time it fails LISTENER_UNAVAILABLE (no timeout of the listener's, which
    # would count toward its ejection), those that got in time out LISTENER_TIMEOUT, and
    # the stream stays open for the assembly after.
    sidecar = await make_sidecar(
        provider_timeout_s=10, eject_after_timeouts=0, limits={"max_outbox_bytes": 1 << 20}
    )
    async with _session(sidecar) as (stub, session_id):
        await _big_sections(stub, session_id)
        start = pb.ListenStart(session_id=session_id, name="slow", timeout_s=0.5)
        listener = await _install(stub, start)
        [stream] = listener_streams(sidecar)
        failed = await _until_one_finds_no_room(stub, stream)
        read: list[str] = []
        reading = asyncio.ensure_future(_mark_only(listener, "after", read))  # it reads again
        # what was sent before is read first: the next assembly's invocation is then the
        # only one the listener has to answer within its time
        await eventually(
            lambda: len(read) == stream.messages_sent, "the listener read all it was sent", 10
        )
        reply = await stub.Assemble(_tagged("after"), timeout=20)
        reading.cancel()
        listener.cancel()
    reasons = [_reason(error) for error in failed]
    # how many got in before the stream was full is gRPC's (its buffers and windows)
    got_in = [str(index) in read for index in range(len(failed))]
    assert reasons == ["LISTENER_TIMEOUT" if sent else "LISTENER_UNAVAILABLE" for sent in got_in]
    assert "LISTENER_UNAVAILABLE" in reasons
    for error, reason in zip(failed, reasons, strict=True):
        if reason == "LISTENER_UNAVAILABLE":
            assert "its stream had no room for this invocation within 0.5s" in (
                error.details() or ""
            )
    assert MARK in [s.name for s in reply.assembly.sections]
    assert _stalled(sidecar) == 0


_MOST_ASSEMBLIES = 24  # ~29 MiB of invocations: more than gRPC's buffers and windows hold


async def _until_one_finds_no_room(
    stub: pb_grpc.SystemPromptServiceStub, stream: ListenerStream
) -> list[Any]:
    """Assemblies one after the other (tagged with their index), each once the one before
    is in the stream or waits for room, until one waiting found no room within the
    listener's time (one let in meanwhile: more go); how each failed, in order."""
    failed: list[Any] = []
    going: list[asyncio.Future[Any]] = []
    while "LISTENER_UNAVAILABLE" not in (reasons := [_reason(error) for error in failed]):
        index = len(failed) + len(going)
        assert index < _MOST_ASSEMBLIES, f"none failed finding no room in time: {reasons}"
        in_or_waiting = _in_or_waiting(stream, stream.messages_sent)
        going.append(asyncio.ensure_future(stub.Assemble(_tagged(str(index)), timeout=20)))
        await eventually(in_or_waiting, f"assembly {index} in the stream or waiting", 10)
        if stream.outbox.waiting():  # the stream is full: see how the one waiting ends
            failed += await asyncio.gather(*going, return_exceptions=True)
            going = []
    return failed


def _in_or_waiting(stream: ListenerStream, sent: int) -> Callable[[], bool]:
    """Whether the stream took an invocation past its first `sent` messages, or one waits
    for room (a cancel counts too: the next assembly then only goes a little sooner)."""
    return lambda: stream.outbox.waiting() > 0 or stream.messages_sent > sent


def _tagged(tag: str) -> pb.AssembleRequest:
    """An assembly whose invocations say `tag` (the listener reads it in their context)."""
    return pb.AssembleRequest(context=pb.AssembleContext(fields_json=json.dumps({"tag": tag})))


async def _mark_only(listener: Any, tag: str, read: list[str]) -> None:
    """Read every message, noting in `read` the tag of each invocation (the kind of any
    other: "cancel"), and answer, marked, only the invocations tagged `tag`."""
    while (message := await listener.read()) is not grpc.aio.EOF:
        if message.WhichOneof("kind") != "invocation":
            read.append(message.WhichOneof("kind"))
            continue
        read.append(json.loads(message.invocation.context.fields_json)["tag"])
        if read[-1] != tag:
            continue
        await _answer_marked(listener, message.invocation)


async def _big_sections(stub: pb_grpc.SystemPromptServiceStub, session_id: str) -> None:
    """1.2 MiB an invocation: more than a stream's flow-control window."""
    for index in range(12):
        request = pb.RegisterSectionRequest(session_id=session_id, name=f"b{index}", text=BIG)
        await stub.RegisterSection(request)


async def test_a_listener_the_sidecar_closed_fails_what_it_would_see_until_it_is_back(
    make_sidecar: SidecarFactory,
) -> None:
    # It stopped reading: the sidecar closes its stream (STREAM_STALLED) but its session
    # lives, so it keeps its place: under FAIL every assembly fails LISTENER_UNAVAILABLE,
    # naming it; on main it was silently absent from them.
    sidecar = await make_sidecar(provider_timeout_s=1, eject_after_timeouts=0)
    async with _session(sidecar) as (stub, session_id):
        await _big_sections(stub, session_id)
        stalled = await _install(stub, pb.ListenStart(session_id=session_id, name="policy"))
        for _ in range(8):  # until the sidecar has closed it for not reading
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Assemble(pb.AssembleRequest(), timeout=5)
            if _stalled(sidecar):
                break
        assert _stalled(sidecar) == 1
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await stalled.read() is not grpc.aio.EOF:
                pass
        assert await stalled.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        away = await asyncio.gather(
            stub.Assemble(pb.AssembleRequest(), timeout=5), return_exceptions=True
        )
        # its client installs it again on the same session: it takes the old one's place
        back = await _install(stub, pb.ListenStart(session_id=session_id, name="policy"))
        marking = asyncio.ensure_future(_mark_everything(back))
        reply = await stub.Assemble(pb.AssembleRequest(), timeout=10)
        marking.cancel()
        back.cancel()
    [error] = away
    assert _reason(error) == "LISTENER_UNAVAILABLE"
    assert 'listener "policy" is unavailable: the sidecar closed its stream' in (
        error.details() or ""  # type: ignore[union-attr]
    )
    assert [s.name for s in reply.assembly.sections].count(MARK) == 1


async def test_an_ignored_listener_the_sidecar_closed_is_named_in_skipped_and_goes_in_time(
    make_sidecar: SidecarFactory,
) -> None:
    # Under IGNORE the assemblies go on without it, naming it in `skipped`; once its
    # owner's dead-peer bound passes without it coming back, it is disposed.
    sidecar = await make_sidecar(
        provider_timeout_s=1, eject_after_timeouts=0, dead_peer_timeout_s=2.0
    )
    async with _session(sidecar) as (stub, session_id):
        await _big_sections(stub, session_id)
        start = pb.ListenStart(
            session_id=session_id, name="decor", failure_policy=pb.FAILURE_POLICY_IGNORE
        )
        stalled = await _install(stub, start)
        for _ in range(8):
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.Assemble(pb.AssembleRequest(), timeout=5)
            if _stalled(sidecar):
                break
        assert _stalled(sidecar) == 1
        stalled.cancel()
        reply = await stub.Assemble(pb.AssembleRequest(), timeout=5)
        skipped = [(s.name, s.reason) for s in reply.skipped]

        async def gone() -> bool:
            later = await stub.Assemble(pb.AssembleRequest(), timeout=5)
            return not later.skipped

        await eventually(gone, "the away listener is disposed after dead_peer_timeout_s", 10)
    assert skipped == [("decor", "LISTENER_UNAVAILABLE")]
