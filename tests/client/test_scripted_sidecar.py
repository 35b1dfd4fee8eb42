"""The client against a sidecar that misbehaves: it never hangs, leaks or believes a wrong answer.

Every test talks to the scripted sidecar (tests/scripted.py); the `scripted`
fixture checks afterwards that no stream is open on it, no task is left in
the loop and the loop never stalled.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from helpers import eventually, rejection
from scripted import (
    CALL_TIMEOUT_S,
    HANG_S,
    End,
    Peer,
    Script,
    ScriptedSidecar,
    Silent,
    connect,
    fail,
    failing,
    invocation,
    next_result,
    opened,
    taken,
    wire_tool,
)

grpc_max_workers = 32  # pytest-grpc: each open stream of the scripted sidecar holds a thread


def provide(call_id: int, key: str, fields_json: str = "") -> pb.OpenSessionResponse:
    call = pb.ProvideCall(provider_key=key, kind=pb.PROVIDER_KIND_SECTION)
    context = pb.AssembleContext(fields_json=fields_json)
    return pb.OpenSessionResponse(
        provide=pb.ProvideRequest(call_id=call_id, calls=[call], context=context)
    )


class SilentAfterOpening(Script):
    """Opens sessions, then never answers a unary call."""

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        Peer(None, context).wait_end()
        return super().answer(method, request, context)


# -- the session stream ---------------------------------------------------------------


async def test_a_session_the_sidecar_never_confirms_fails_connect_within_the_call_timeout(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Silent("open_session", "listen", "watch")
    started = time.monotonic()
    error = await rejection(connect(scripted), within=HANG_S)
    assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "SIDECAR_UNAVAILABLE")
    assert "opening the session" in error.message
    assert time.monotonic() - started < CALL_TIMEOUT_S + 2


async def test_a_session_stream_that_does_not_start_with_opened_is_a_protocol_error(
    scripted: ScriptedSidecar,
) -> None:
    class ProvidesFirst(Script):
        def open_session(self, peer: Peer) -> Iterator[pb.OpenSessionResponse]:
            yield provide(1, "p1")
            peer.wait_end()

    scripted.script = ProvidesFirst()
    error = await rejection(connect(scripted), within=HANG_S)
    assert (error.code, error.reason) == (grpc.StatusCode.INTERNAL, "PROTOCOL_ERROR")


async def test_a_second_opened_is_ignored_and_the_session_keeps_its_first_id(
    scripted: ScriptedSidecar,
) -> None:
    async with connect(scripted) as client:
        first_id = client.session_id
        await client.section("s", 1, lambda ctx: "value")
        session = scripted.script.sessions[0]
        session.outbox.put(opened("another-session"))
        session.outbox.put(provide(1, "p1"))
        answer = await taken(session)
        assert client.session_id == first_id
        assert answer.provided.values[0].text == "value"


async def test_a_provide_request_for_a_key_never_registered_is_answered_with_an_error(
    scripted: ScriptedSidecar,
) -> None:
    async with connect(scripted):
        session = scripted.script.sessions[0]
        session.outbox.put(provide(7, "never-registered"))
        answer = await taken(session)
    value = answer.provided.values[0]
    assert (answer.provided.call_id, value.provider_key) == (7, "never-registered")
    assert "disposed" in value.error.message


async def test_a_provide_request_repeated_while_it_runs_is_answered_once(
    scripted: ScriptedSidecar,
) -> None:
    release = asyncio.Event()
    asked = asyncio.Event()

    async def slow(ctx: dsp.AssembleContext) -> str:
        asked.set()
        await release.wait()
        return "once"

    async with connect(scripted) as client:
        await client.section("s", 1, slow)
        session = scripted.script.sessions[0]
        session.outbox.put(provide(1, "p1"))
        await asyncio.wait_for(asked.wait(), 5)
        session.outbox.put(provide(1, "p1"))  # the same call again, while it runs
        session.outbox.put(provide(2, "p1"))
        await eventually(lambda: _answering(client) == 2, "call 2 is being answered too")
        release.set()
        answers = [await taken(session), await taken(session)]
        assert sorted(a.provided.call_id for a in answers) == [1, 2]
        with pytest.raises(queue.Empty):
            await taken(session, timeout=0.3)  # call 1 was answered once


def _answering(client: dsp.Client) -> int:
    session = client._connection._session
    return 0 if session is None else session._stream.running()


async def test_provide_fields_that_are_not_json_are_answered_with_an_error(
    scripted: ScriptedSidecar,
) -> None:
    async with connect(scripted) as client:
        await client.section("s", 1, lambda ctx: "never asked")
        session = scripted.script.sessions[0]
        session.outbox.put(provide(1, "p1", fields_json="{not json"))
        answer = await taken(session)
    assert "JSON" in answer.provided.values[0].error.message


# -- unary calls ----------------------------------------------------------------------


async def test_a_registration_the_sidecar_never_answers_fails_and_the_session_is_made_again(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = SilentAfterOpening()
    async with connect(scripted) as client:
        error = await rejection(client.section("s", 1, "text"), within=HANG_S)
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "SIDECAR_UNAVAILABLE")
        assert "RegisterSection" in error.message or "Contribution" in error.message
        # It may be registered on that session: a new session leaves nothing of it.
        await eventually(lambda: len(scripted.script.sessions) >= 2, "a new session is opened")
        await asyncio.to_thread(scripted.script.sessions[0].ended.wait, 5)
        assert scripted.script.sessions[0].ended.is_set()


async def test_an_assembly_the_sidecar_never_answers_fails_at_its_timeout(
    scripted: ScriptedSidecar,
) -> None:
    error = await failing(scripted, SilentAfterOpening(), lambda c: c.assemble(timeout=0.3))
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.reason == "UNKNOWN"


# -- errors ---------------------------------------------------------------------------


class Refuses(Script):
    """Refuses every Assemble with `code`, `message` and (maybe) an ErrorInfo reason."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str | None) -> None:
        super().__init__()
        self.failure = (code, message, reason)

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        if method == "Assemble":
            fail(context, *self.failure)
        return super().answer(method, request, context)


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        pytest.param(
            grpc.StatusCode.FAILED_PRECONDITION, "UNKNOWN", "no reason given", id="unknown"
        ),
        pytest.param(
            grpc.StatusCode.UNAVAILABLE,
            "SIDECAR_UNAVAILABLE",
            "sidecar unavailable: no reason given",
            id="unavailable",
        ),
    ],
)
async def test_an_error_without_error_info_has_the_reason_its_code_gives(
    scripted: ScriptedSidecar, code: grpc.StatusCode, reason: str, message: str
) -> None:
    refusal = Refuses(code, "no reason given", None)
    error = await failing(scripted, refusal, lambda c: c.assemble())
    assert (error.code, error.reason, error.message) == (code, reason, message)


async def test_an_error_with_a_huge_message_still_arrives_with_a_code_and_reason(
    scripted: ScriptedSidecar,
) -> None:
    huge = "x" * 200_000
    scripted.script = Refuses(grpc.StatusCode.ABORTED, huge, "PROVIDER_FAILED")
    async with connect(scripted) as client:
        error = await rejection(client.assemble(), within=HANG_S)
        assert isinstance(error.reason, str) and error.reason
        assert len(error.message) <= 200_000
        assert await client.section("still", 1, "works") is not None


# -- the listener stream --------------------------------------------------------------


async def test_a_listener_the_sidecar_never_confirms_fails_within_the_call_timeout(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Silent("listen")
    async with connect(scripted) as client:
        error = await rejection(client.on_assemble(_pass_through), within=HANG_S)
        assert (error.code, error.reason) == (grpc.StatusCode.UNAVAILABLE, "SIDECAR_UNAVAILABLE")
        assert "listener" in error.message


async def test_a_listener_stream_that_does_not_start_with_registered_is_a_protocol_error(
    scripted: ScriptedSidecar,
) -> None:
    class InvokesFirst(Script):
        def listen(self, peer: Peer) -> Iterator[pb.ListenResponse]:
            yield invocation(1)
            peer.wait_end()

    error = await failing(scripted, InvokesFirst(), lambda c: c.on_assemble(_pass_through))
    assert error.reason == "PROTOCOL_ERROR"


async def _pass_through(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
) -> dsp.PromptAssembly:
    result: dsp.PromptAssembly = await next_()
    return result


class Caught:
    """A listener that awaits next() and keeps what it raised, and whether it ended."""

    def __init__(self) -> None:
        self.raised: BaseException | None = None
        self.ended = asyncio.Event()

    async def __call__(
        self, assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> dsp.PromptAssembly:
        try:
            result: dsp.PromptAssembly = await next_()
            return result
        except BaseException as error:
            self.raised = error
            raise
        finally:
            self.ended.set()


async def _invoked(scripted: ScriptedSidecar, listener: Caught, *tools: pb.ToolSchema) -> Peer:
    """The listener's stream, after an invocation with `tools` whose next() was sent."""
    stream = scripted.script.listeners[-1]
    stream.outbox.put(invocation(1, *tools))
    sent = await taken(stream)
    assert sent.WhichOneof("kind") == "next"
    return stream


async def test_a_next_result_for_an_unknown_invocation_is_ignored(
    scripted: ScriptedSidecar,
) -> None:
    listener = Caught()
    async with connect(scripted) as client:
        await client.on_assemble(listener)
        stream = await _invoked(scripted, listener)
        stream.outbox.put(next_result(99, []))
        stream.outbox.put(next_result(1, []))
        reply = await taken(stream)
    assert (reply.WhichOneof("kind"), reply.result.invocation_id) == ("result", 1)
    assert listener.raised is None


@pytest.mark.parametrize(
    ("slots", "tools"),
    [([5], ()), ([-2], ()), ([0], (wire_tool("extra"),)), ([-1, -1], (wire_tool("one"),))],
    ids=["past-the-tools", "below-minus-one", "a-new-tool-too-many", "a-new-tool-missing"],
)
async def test_tool_slots_that_cannot_be_right_fail_next_with_a_protocol_error(
    scripted: ScriptedSidecar, slots: list[int], tools: tuple[pb.ToolSchema, ...]
) -> None:
    listener = Caught()
    async with connect(scripted) as client:
        await client.on_assemble(listener)
        stream = await _invoked(scripted, listener, wire_tool("t0"))
        stream.outbox.put(next_result(1, slots, *tools))
        reply = await taken(stream)
    assert isinstance(listener.raised, dsp.SystemPromptError)
    assert listener.raised.reason == "PROTOCOL_ERROR"
    assert reply.WhichOneof("kind") == "failure"
    assert "protocol error" in reply.failure.message


@pytest.mark.parametrize(
    "end",
    [End(), End(grpc.StatusCode.UNAVAILABLE, "going away"), End(grpc.StatusCode.INTERNAL, "bug")],
    ids=["ok", "unavailable", "internal"],
)
async def test_a_listener_stream_ended_under_next_ends_the_call_and_installs_it_again(
    scripted: ScriptedSidecar, end: End
) -> None:
    listener = Caught()
    async with connect(scripted) as client:
        await client.on_assemble(listener)
        stream = await _invoked(scripted, listener)
        stream.outbox.put(end)
        await asyncio.wait_for(listener.ended.wait(), 5)
        assert isinstance(listener.raised, asyncio.CancelledError)
        # The sidecar dropped the listener's stream: it is installed again on the same
        # session, which keeps its other registrations (issue 34: it made a new one).
        await eventually(
            lambda: (
                client.connected
                and len(scripted.script.listeners) == 2
                and scripted.script.listeners[1].start is not None
            ),
            "the listener is installed again on the same session",
        )
        assert len(scripted.script.sessions) == 1
        assert scripted.script.listeners[1].start.start.session_id == client.session_id


async def test_a_repeated_invocation_id_runs_the_listener_once(
    scripted: ScriptedSidecar,
) -> None:
    calls = 0
    release = asyncio.Event()

    async def counts(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> dsp.PromptAssembly:
        nonlocal calls
        calls += 1
        await release.wait()
        return assembly

    async with connect(scripted) as client:
        await client.on_assemble(counts)
        stream = scripted.script.listeners[0]
        stream.outbox.put(invocation(1))
        await eventually(lambda: calls == 1, "the listener runs")
        stream.outbox.put(invocation(1))
        stream.outbox.put(invocation(2))
        await eventually(lambda: calls == 2, "the second invocation runs")
        release.set()
        replies = [await taken(stream), await taken(stream)]
        assert sorted(r.result.invocation_id for r in replies) == [1, 2]
        with pytest.raises(queue.Empty):
            await taken(stream, timeout=0.3)
    assert calls == 2


# -- replay ---------------------------------------------------------------------------


class Replay(Script):
    """Sessions as usual, but the first replayed registration on the second session
    meets `misstep` (run in the sidecar's thread) before it is answered."""

    def __init__(self, misstep: str) -> None:
        super().__init__()
        self.misstep = misstep
        self.ids: list[str] = []

    def open_session(self, peer: Peer) -> Iterator[pb.OpenSessionResponse]:
        peer.start = peer.take()
        self.ids.append(self.new_id("session-"))
        yield opened(self.ids[-1])
        yield from peer.outgoing()

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        if len(self.ids) == 2 and request.session_id == self.ids[1] and self.misstep:
            misstep, self.misstep = self.misstep, ""
            session = self.sessions[1]
            if misstep == "end the session":
                session.outbox.put(End())
                session.ended.wait(5)
            elif misstep == "cut the session":
                session.outbox.put(End(grpc.StatusCode.UNAVAILABLE, "restarting"))
                session.ended.wait(5)
            elif misstep == "refuse":
                fail(context, grpc.StatusCode.ALREADY_EXISTS, "taken", "DUPLICATE_NAME")
            elif misstep == "never answer":
                Peer(None, context).wait_end()
        return super().answer(method, request, context)

    def names_on(self, session_id: str) -> list[str]:
        return [
            r.name for m, r in self.unary if m == "RegisterSection" and r.session_id == session_id
        ]


@pytest.mark.parametrize(
    "misstep", ["end the session", "cut the session", "refuse", "never answer"]
)
async def test_a_replay_that_goes_wrong_is_done_again_on_a_new_session(
    scripted: ScriptedSidecar, misstep: str
) -> None:
    script = Replay(misstep)
    scripted.script = script
    async with connect(scripted) as client:
        await client.section("a", 1, "A")
        await client.section("b", 2, "B")
        script.sessions[0].outbox.put(End(grpc.StatusCode.UNAVAILABLE, "restarting"))
        await eventually(
            lambda: len(script.ids) == 3 and client.connected, "a third session replays", 10
        )
        assert client.session_id == script.ids[2]
        assert script.names_on(script.ids[2]) == ["a", "b"]
        # The second session, whatever happened to it, is over: no orphan keeps "a".
        await asyncio.to_thread(script.sessions[1].ended.wait, 5)
        assert script.sessions[1].ended.is_set()
        assert scripted.open_streams == 1
