"""Issue 22, finding 1: a callback that does not answer is a dead peer, ejected after its
timeout, so that it costs the assemblies of one timeout and none after."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, eventually, metric, next_events, raw_channel, raw_stub

Stub = pb_grpc.SystemPromptServiceStub


def _reason(error: grpc.aio.AioRpcError) -> str:
    return str(dict(error.trailing_metadata() or ()).get("dsh-error-reason", ""))


async def _outcome(stub: Stub, timeout: float = 10) -> str:
    try:
        await stub.Assemble(pb.AssembleRequest(), timeout=timeout)
    except grpc.aio.AioRpcError as error:
        return _reason(error) or error.code().name
    return "ok"


@contextlib.asynccontextmanager
async def _opened(sidecar: Sidecar) -> AsyncIterator[tuple[Stub, Any, str]]:
    """A raw stub of `sidecar` and a session on it (its stream and id), closed after."""
    async with raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        session, session_id = await _session(stub)
        try:
            yield stub, session, session_id
        finally:
            session.cancel()


async def _session(stub: Stub) -> tuple[Any, str]:
    call = stub.OpenSession()
    await call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="t")))
    return call, (await call.read()).opened.session_id


async def _listener(stub: Stub, session_id: str, name: str = "silent", timeout_s: float = 0) -> Any:
    """A Listen stream started as listener `name` of `session_id`, its ack read; as it
    stands, a listener that reads its invocations and never answers one."""
    listen = stub.Listen()
    start = pb.ListenStart(session_id=session_id, name=name, timeout_s=timeout_s)
    await listen.write(pb.ListenRequest(start=start))
    assert (await listen.read()).WhichOneof("kind") == "registered"
    return listen


async def _dynamic_section(stub: Stub, session_id: str, dynamic: pb.Dynamic) -> Any:
    """Section "slow" of `session_id`, answered by the session's provider `dynamic` names."""
    request = pb.RegisterSectionRequest(session_id=session_id, name="slow", dynamic=dynamic)
    return await stub.RegisterSection(request)


@contextlib.asynccontextmanager
async def _silent(sidecar: Sidecar) -> AsyncIterator[tuple[Stub, Any]]:
    """A raw stub of `sidecar` and a silent listener (its Listen stream) of a session on
    it, closed after."""
    async with _opened(sidecar) as (stub, _session_call, session_id):
        listen = await _listener(stub, session_id)
        try:
            yield stub, listen
        finally:
            listen.cancel()


Answer = Callable[[pb.ListenerInvocation], Awaitable[pb.ListenRequest]]


@contextlib.asynccontextmanager
async def _answering(
    sidecar: Sidecar, answer: Answer, name: str, timeout_s: float = 0
) -> AsyncIterator[Stub]:
    """A raw stub of `sidecar` and, on a session of it, listener `name` answering each
    invocation with what `answer` makes of it until the block ends."""
    async with _opened(sidecar) as (stub, _session_call, session_id):
        listen = await _listener(stub, session_id, name, timeout_s)

        async def answer_each() -> None:
            while (message := await listen.read()) is not grpc.aio.EOF:
                if message.WhichOneof("kind") == "invocation":
                    await listen.write(await answer(message.invocation))

        answering = asyncio.create_task(answer_each())
        try:
            yield stub
        finally:
            answering.cancel()
            listen.cancel()


async def _until_end(call: Any) -> list[Any]:
    """Every message `call` sends until its end."""
    messages = []
    while (message := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
        messages.append(message)
    return messages


def _ejected(sidecar: Sidecar, kind: str) -> float:
    return metric(sidecar, "dsp_ejected_callbacks_total", kind=kind)


def _listeners(sidecar: Sidecar) -> int:
    return sum(1 for entry in sidecar.registry.registrations() if entry.kind.value == "listener")


async def test_a_listener_that_does_not_answer_is_ejected_after_one_timeout(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    async with _silent(sidecar) as (stub, listen):
        first, second = await _outcome(stub), await _outcome(stub)
        told = await _until_end(listen)  # the invocation, then the ejection
    assert (first, second) == ("LISTENER_TIMEOUT", "ok")
    ejected = told[-1].ejected
    assert ejected.reason == "LISTENER_TIMEOUT"
    assert ejected.message == 'listener "silent" did not answer within 0.5s'
    assert _ejected(sidecar, "listener") == 1
    assert _listeners(sidecar) == 0


async def test_an_ejected_listener_goes_with_an_event_that_says_why(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    async with _silent(sidecar) as (stub, _listen):
        watch = stub.WatchChanges(pb.WatchChangesRequest())
        await watch.read()  # subscribed
        await _outcome(stub)
        event = (await asyncio.wait_for(watch.read(), 10)).event
        watch.cancel()
    assert (event.kind, event.action) == (pb.CHANGE_KIND_LISTENER, pb.CHANGE_ACTION_UNREGISTERED)
    assert event.reason == 'ejected: listener "silent" did not answer within 0.5s'


async def test_eject_after_timeouts_0_keeps_a_silent_listener_as_before(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5, eject_after_timeouts=0)
    async with _silent(sidecar) as (stub, _listen):
        outcomes = [await _outcome(stub), await _outcome(stub)]
    assert outcomes == ["LISTENER_TIMEOUT", "LISTENER_TIMEOUT"]
    assert _ejected(sidecar, "listener") == 0


async def test_a_listener_is_ejected_after_eject_after_timeouts_in_a_row(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5, eject_after_timeouts=2)
    async with _silent(sidecar) as (stub, _listen):
        outcomes = [await _outcome(stub) for _ in range(3)]
    assert outcomes == ["LISTENER_TIMEOUT", "LISTENER_TIMEOUT", "ok"]


async def test_a_timeout_cut_short_by_the_callers_deadline_ejects_nothing(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=30)
    async with _silent(sidecar) as (stub, _listen):
        outcome = await _outcome(stub, timeout=0.5)
        listeners = _listeners(sidecar)
    assert outcome in ("LISTENER_TIMEOUT", "DEADLINE_EXCEEDED")
    assert listeners == 1


async def test_a_listener_that_fails_loudly_every_time_is_not_ejected(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)

    async def fail(invocation: pb.ListenerInvocation) -> pb.ListenRequest:
        failure = pb.ListenerFailure(invocation_id=invocation.invocation_id, message="boom")
        return pb.ListenRequest(failure=failure)

    async with _answering(sidecar, fail, "loud") as stub:
        outcomes = [await _outcome(stub) for _ in range(3)]
    assert outcomes == ["LISTENER_FAILED"] * 3
    assert _ejected(sidecar, "listener") == 0


async def test_a_provider_that_does_not_answer_is_ejected_and_its_session_told(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    async with _opened(sidecar) as (stub, session, session_id):
        reply = await _dynamic_section(stub, session_id, pb.Dynamic(provider_key="p"))
        first, second = await _outcome(stub), await _outcome(stub)
        kinds = []
        while (message := await asyncio.wait_for(session.read(), 10)).WhichOneof("kind") != (
            "ejected"
        ):
            kinds.append(message.WhichOneof("kind"))
        open_sessions = len(sidecar.state.sessions)
    assert (first, second) == ("PROVIDER_TIMEOUT", "ok")
    assert message.ejected.registration_id == reply.registration_id
    assert message.ejected.reason == "PROVIDER_TIMEOUT"
    assert _ejected(sidecar, "provider") == 1
    assert open_sessions == 1  # the session stays; only the provider went


async def test_a_callback_with_its_own_longer_timeout_is_waited_for(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.2)

    async def answer_late(invocation: pb.ListenerInvocation) -> pb.ListenRequest:
        await asyncio.sleep(0.5)  # longer than provider_timeout_s, within its own
        result = pb.ListenerResult(
            invocation_id=invocation.invocation_id, assembly=invocation.assembly
        )
        return pb.ListenRequest(result=result)

    async with _answering(sidecar, answer_late, "slow", timeout_s=30) as stub:
        outcome = await _outcome(stub)
    assert outcome == "ok"
    assert _ejected(sidecar, "listener") == 0


async def test_a_timeout_s_over_max_callback_timeout_s_is_value_too_large(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(max_callback_timeout_s=10)
    async with _opened(sidecar) as (stub, _session_call, session_id):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _dynamic_section(stub, session_id, pb.Dynamic(provider_key="p", timeout_s=11))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(caught.value) == "VALUE_TOO_LARGE"
    assert "max_callback_timeout_s" in (caught.value.details() or "")


async def test_assemblies_after_the_ejection_answer_while_the_silent_peer_stays_connected(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    async with _silent(sidecar) as (stub, _listen):
        await _outcome(stub)  # the one timeout
        outcomes = [await _outcome(stub) for _ in range(20)]
        await eventually(lambda: _listeners(sidecar) == 0, "the listener is gone")
    assert outcomes == ["ok"] * 20


# -- the clients install an ejected callback again --------------------------------------


async def test_the_python_client_installs_an_ejected_listener_again_and_its_handle_holds(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    calls: list[int] = []

    async def sign(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(30)  # stuck, the first time: longer than its time
        assembly.variables["signed"] = "yes"
        return await next_()

    async with dsp.connect(sidecar.address) as client:
        handle = await client.on_assemble(sign)
        with pytest.raises(dsp.SystemPromptError) as caught:
            await client.assemble()
        await eventually(lambda: _listeners(sidecar) == 1, "the listener installed again", 15)
        assembly = await client.assemble()
        await handle()
        left = _listeners(sidecar)
    assert caught.value.reason == "LISTENER_TIMEOUT"
    assert assembly.variables["signed"] == "yes"
    assert left == 0


async def test_the_python_client_registers_an_ejected_provider_again_on_its_session(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    calls: list[int] = []

    async def clock(ctx: dsp.AssembleContext) -> str:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(30)  # stuck, the first time
        return "It is noon."

    async with dsp.connect(sidecar.address) as client:
        await client.section("clock", 10, clock)
        (before,) = [session.id for session in sidecar.state.sessions.all()]
        with pytest.raises(dsp.SystemPromptError) as caught:
            await client.assemble()
        await eventually(
            lambda: any(e.name == "clock" for e in sidecar.registry.registrations()),
            "the provider registered again",
            15,
        )
        assembly = await client.assemble()
        after = [session.id for session in sidecar.state.sessions.all()]
    assert caught.value.reason == "PROVIDER_TIMEOUT"
    assert assembly.sections[-1].text == "It is noon."
    assert after == [before]  # on the same session: nothing else was made again


async def test_the_python_client_shows_why_the_sidecar_disposed_an_ejected_callback(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    async with dsp.connect(sidecar.address) as client, raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        session, session_id = await _session(stub)
        changes = await client.watch_changes()
        await _listener(stub, session_id)
        await _outcome(stub)
        registered, unregistered = await next_events(changes, 2)
        session.cancel()
    assert (registered.reason, unregistered.action) == ("", "unregistered")
    assert unregistered.reason == 'ejected: listener "silent" did not answer within 0.5s'
