"""A scripted sidecar: a threaded grpc.server (from pytest-grpc) whose every answer a test writes.

The real sidecar never misbehaves on purpose; this one does whatever the
current test's `Script` says: a wrong message, a stream cut mid-replay, an
error without a reason, silence. It counts the streams that are open on it,
so a test can show the client left none behind.

A script is a subclass of `Script` that overrides the calls it cares about;
the defaults answer like a well-behaved sidecar. Stream handlers are
generators over a `Peer` (what the client sent, and the call's life).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dsh_system_prompt as dsp
import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from helpers import polled, rejection

CALL_TIMEOUT_S = 0.5  # the call_timeout of the clients tests connect
HANG_S = 5.0  # a client call still running after this long has hung
WAIT_S = 30.0  # a silent script gives up after this, so a stuck test frees its thread


class Peer:
    """One stream as the scripted sidecar sees it: the client's messages, and its end."""

    def __init__(self, requests: Iterator[Any] | None, context: grpc.ServicerContext) -> None:
        self.context = context
        self.start: Any = None  # the client's first message, once a script took it
        self.received: queue.Queue[Any] = queue.Queue()  # requests; None when the client is done
        self.outbox: queue.Queue[Any] = queue.Queue()  # what a test sends through `outgoing()`
        self.ended = threading.Event()  # the call is over (finished, cancelled or cut)
        context.add_callback(self._end)
        if requests is not None:
            threading.Thread(target=self._pump, args=(requests,), daemon=True).start()

    def outgoing(self) -> Iterator[Any]:
        """What the test puts in `outbox`, until the client is done, the call ends or
        the test puts an `End` there."""
        while (message := self.outbox.get()) is not _END:
            if isinstance(message, End):
                if message.code != grpc.StatusCode.OK:
                    fail(self.context, message.code, message.message, message.reason)
                return
            yield message

    def take(self, timeout: float = 5.0) -> Any:
        """The client's next message, for a test waiting off the loop."""
        return self.received.get(timeout=timeout)

    def _end(self) -> None:
        self.ended.set()
        self.outbox.put(_END)

    def wait_end(self) -> None:
        """Block until the call is over: what a silent sidecar does."""
        self.ended.wait(WAIT_S)

    def _pump(self, requests: Iterator[Any]) -> None:
        try:
            for request in requests:
                self.received.put(request)
        except grpc.RpcError:
            pass
        except Exception:  # the call ended under the iterator
            pass
        self.received.put(None)
        self.outbox.put(_END)


_END = object()


@dataclass(frozen=True)
class End:
    """Put in an outbox: end the stream there, with OK or with this error."""

    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    reason: str | None = None


def fail(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    reason: str | None = None,
) -> None:
    """End the call with `code` and `message`, and an ErrorInfo `reason` when given."""
    status = status_pb2.Status(code=code.value[0], message=message)
    if reason is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.ErrorInfo(reason=reason, domain="dsh.systemprompt.v1"))
        status.details.append(detail)
    context.abort_with_status(rpc_status.to_status(status))


def opened(session_id: str, **fields: Any) -> pb.OpenSessionResponse:
    return pb.OpenSessionResponse(opened=pb.SessionOpened(session_id=session_id, **fields))


def registered(registration_id: str, **fields: Any) -> pb.ListenResponse:
    return pb.ListenResponse(
        registered=pb.ListenerRegistered(registration_id=registration_id, **fields)
    )


def with_unknown_field(message: Any, number: int = 999, text: bytes = b"from the future") -> Any:
    """`message` with a length-delimited field this proto does not have (a newer sidecar's)."""
    tag = bytes(_varint(number << 3 | 2))
    extra = tag + bytes(_varint(len(text))) + text
    copy = type(message)()
    copy.ParseFromString(message.SerializeToString() + extra)
    return copy


def _varint(value: int) -> Iterator[int]:
    while value > 0x7F:
        yield value & 0x7F | 0x80
        value >>= 7
    yield value


class Script:
    """What the scripted sidecar does; the defaults are a well-behaved sidecar's."""

    session_features: tuple[str, ...] = ()
    listener_features: tuple[str, ...] = ("tool-slots",)

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.sessions: list[Peer] = []  # every session stream, in the order opened
        self.listeners: list[Peer] = []
        self.watchers: list[Peer] = []
        self.watch_requests: list[pb.WatchChangesRequest] = []
        self.unary: list[tuple[str, Any]] = []  # (method, request) of every unary call

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def open_session(self, peer: Peer) -> Iterator[pb.OpenSessionResponse]:
        peer.start = peer.take()
        yield opened(self.new_id("session-"), features=list(self.session_features))
        yield from peer.outgoing()

    def listen(self, peer: Peer) -> Iterator[pb.ListenResponse]:
        peer.start = peer.take()
        yield registered(self.new_id("listener-"), features=list(self.listener_features))
        yield from peer.outgoing()

    def watch(self, peer: Peer) -> Iterator[pb.WatchChangesResponse]:
        yield pb.WatchChangesResponse(subscribed=pb.WatchSubscribed(revision=10))
        yield from peer.outgoing()

    def list_registrations(
        self, request: pb.ListRegistrationsRequest
    ) -> Iterator[pb.ListRegistrationsResponse]:
        """A listing: nothing registered, at revision 10."""
        yield pb.ListRegistrationsResponse(revision=10)

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        """A unary call's answer: a registration id, a scope id, or an empty reply."""
        reply = _REPLIES[method]()
        if hasattr(reply, "registration_id"):
            reply.registration_id = self.new_id("registration-")
        if hasattr(reply, "scope_id"):
            reply.scope_id = self.new_id("scope-")
        return reply


_REPLIES: dict[str, Callable[[], Any]] = {
    "RegisterSection": pb.RegisterSectionResponse,
    "RegisterContext": pb.RegisterContextResponse,
    "RegisterTools": pb.RegisterToolsResponse,
    "RegisterVariable": pb.RegisterVariableResponse,
    "SuppressRuntimeContext": pb.SuppressRuntimeContextResponse,
    "OpenScope": pb.OpenScopeResponse,
    "Dispose": pb.DisposeResponse,
    "Assemble": pb.AssembleResponse,
    "GetCacheHistory": pb.GetCacheHistoryResponse,
}


def _unanswered(peer: Peer) -> Iterator[Any]:
    """A stream taken and never answered, until the client ends it."""
    peer.wait_end()
    yield from ()


class Silent(Script):
    """A well-behaved sidecar but on the streams named ("open_session", "listen",
    "watch"), which it takes and never answers."""

    def __init__(self, *streams: str) -> None:
        super().__init__()
        for name in streams:
            setattr(self, name, _unanswered)


def _unary_rpc(method: str) -> Any:  # Any: it stands for each RPC's own stub signature
    """The servicer's `method`: the script's answer to a unary call (`_unary`)."""

    def rpc(self: ScriptedSidecar, request: Any, context: grpc.ServicerContext) -> Any:
        return self._unary(method, request, context)

    rpc.__name__ = method
    return rpc


class ScriptedSidecar(pb_grpc.SystemPromptServiceServicer):  # type: ignore[misc]
    """The servicer pytest-grpc serves; `script` is replaced by every test."""

    def __init__(self) -> None:
        self.script = Script()
        self._lock = threading.Lock()
        self._open = 0
        self.all_closed = threading.Condition(self._lock)
        self.address = ""  # set by the fixture: where pytest-grpc serves it

    @property
    def open_streams(self) -> int:
        with self._lock:
            return self._open

    def wait_all_closed(self, timeout: float) -> bool:
        """True once no stream is open on the sidecar (the client left none behind)."""
        with self.all_closed:
            return self.all_closed.wait_for(lambda: self._open == 0, timeout)

    def OpenSession(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        peer = self._peer(requests, context)
        self.script.sessions.append(peer)
        yield from self.script.open_session(peer)

    def Listen(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        peer = self._peer(requests, context)
        self.script.listeners.append(peer)
        yield from self.script.listen(peer)

    def WatchChanges(self, request: Any, context: grpc.ServicerContext) -> Any:
        peer = self._peer(None, context)
        self.script.watchers.append(peer)
        self.script.watch_requests.append(request)
        yield from self.script.watch(peer)

    def ListRegistrations(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.script.unary.append(("ListRegistrations", request))
        yield from self.script.list_registrations(request)

    def _peer(self, requests: Iterator[Any] | None, context: grpc.ServicerContext) -> Peer:
        with self._lock:
            self._open += 1
        context.add_callback(self._closed)
        return Peer(requests, context)

    def _closed(self) -> None:
        with self.all_closed:
            self._open -= 1
            self.all_closed.notify_all()

    RegisterSection = _unary_rpc("RegisterSection")
    RegisterContext = _unary_rpc("RegisterContext")
    RegisterTools = _unary_rpc("RegisterTools")
    RegisterVariable = _unary_rpc("RegisterVariable")
    SuppressRuntimeContext = _unary_rpc("SuppressRuntimeContext")
    OpenScope = _unary_rpc("OpenScope")
    Dispose = _unary_rpc("Dispose")
    Assemble = _unary_rpc("Assemble")
    GetCacheHistory = _unary_rpc("GetCacheHistory")

    def _unary(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        self.script.unary.append((method, request))
        return self.script.answer(method, request, context)


# -- for tests: a client of the scripted sidecar, and the messages they send ------------


def connect(sidecar: ScriptedSidecar) -> Any:
    return dsp.connect(sidecar.address, call_timeout=CALL_TIMEOUT_S)


async def taken(peer: Peer, timeout: float = 5.0) -> Any:
    """What the client sends next on `peer`'s stream, waited for off the loop."""
    return await asyncio.to_thread(peer.take, timeout)


def invocation(invocation_id: int, *tools: pb.ToolSchema) -> pb.ListenResponse:
    assembly = pb.PromptAssembly(tools=tools)
    return pb.ListenResponse(
        invocation=pb.ListenerInvocation(invocation_id=invocation_id, assembly=assembly)
    )


def next_result(invocation_id: int, slots: list[int], *tools: pb.ToolSchema) -> pb.ListenResponse:
    result = pb.ListenerNextResult(
        invocation_id=invocation_id, assembly=pb.PromptAssembly(tools=tools), tool_slots=slots
    )
    return pb.ListenResponse(next_result=result)


def wire_tool(name: str) -> pb.ToolSchema:
    return pb.ToolSchema(name=name, description=f"the {name} tool", parameters_json="{}")


class LoopWatch:
    """Measures the longest stall of the running event loop while it runs."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(_TICK_S)
            self.longest = max(self.longest, loop.time() - before - _TICK_S)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


_TICK_S = 0.01


async def left_behind(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """Tasks started since `before` that are still alive, after giving them a moment."""
    current = asyncio.current_task()

    def alive() -> set[asyncio.Task[Any]]:
        return {t for t in asyncio.all_tasks() - before if t is not current and not t.done()}

    await polled(lambda: not alive(), timeout=1.0)  # cancelled tasks need a few loop turns
    return alive()


async def failing(
    scripted: ScriptedSidecar, script: Script, call: Callable[[dsp.Client], Awaitable[object]]
) -> dsp.SystemPromptError:
    """What `call`, by a client of `scripted` playing `script`, fails with (within HANG_S)."""
    scripted.script = script
    async with connect(scripted) as client:
        return await rejection(call(client), within=HANG_S)
