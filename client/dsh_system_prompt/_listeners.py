"""A waterfall listener's stream: invocations in, next() and results out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import (
    FEATURE_CALLBACK_CACHE,
    FEATURE_PART_SLOTS,
    FEATURE_TOOL_SLOTS,
    Reason,
)

from ._convert import context_from_proto
from ._dispatch import Dispatch, Handler
from ._opening import TwoWayCall, confirmed
from ._part_slots import Invocation, Parts, Slotted
from ._tracing import span
from .errors import SystemPromptError
from .types import AssembleContext, PromptAssembly

Next = Callable[..., Awaitable[PromptAssembly]]
"""The `next` a listener receives: `await next()` (or `next(assembly)`) runs the rest."""
Listener = Callable[
    [PromptAssembly, AssembleContext, Next], Awaitable[PromptAssembly | Awaitable[PromptAssembly]]
]
"""`async def listener(assembly, context, next)`: returns the final assembly, or
`next()` itself, un-awaited, to hand the rest of the chain's result on (a tail call)."""


def listener_name(listener: object) -> str:
    """A label for errors: the function's qualified name, kept short."""
    return label(str(getattr(listener, "__qualname__", None) or type(listener).__name__))


def label(name: str) -> str:
    # The end of a qualified name is the telling part: keep it.
    return name if len(name) <= _LABEL_LIMIT else "…" + name[1 - _LABEL_LIMIT :]


_LABEL_LIMIT = 120


_ListenCall = TwoWayCall[pb.ListenRequest]  # the client's side of a Listen stream


class ListenerStream:
    """Runs one listener for every invocation the sidecar sends."""

    def __init__(
        self,
        stub: pb_grpc.SystemPromptServiceStub,
        listener: Listener,
        on_lost: Callable[[str], None] = lambda _: None,
        on_ejected: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._stub = stub
        self._listener = listener
        self._name = ""  # as the sidecar knows it, for trace spans
        self._on_lost = on_lost
        self._on_ejected = on_ejected
        self._ejected = ""  # why the sidecar ejected it, once it said so
        self._call: _ListenCall | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        handlers: dict[str, Handler] = {
            "invocation": self._start,
            "next_result": self._next_result,
            "cancel": self._cancel,
            "ejected": self._ejected_by_sidecar,
        }
        self._stream = Dispatch(pb.ListenResponse, handlers)
        self._next_results: dict[int, asyncio.Future[pb.ListenerNextResult]] = {}
        self.tool_slots = False  # whether the sidecar confirmed `tool-slots`
        self.part_slots = False  # ... and `part-slots`: both sides keep the stream's base
        self._base: Parts | None = None  # the last invocation's parts, with part slots
        self.callback_cache = False  # whether it confirmed `callback-cache`

    async def start(self, start: pb.ListenStart, timeout: float) -> str:
        """Install the listener, confirmed within `timeout`; returns its registration id."""
        self._name = start.name
        call: _ListenCall = self._stub.Listen()
        self._call = call
        sent = call.write(pb.ListenRequest(start=start))
        doing, named = "installing a listener", ("registration_id", "registration id")
        first = await confirmed(call, sent, pb.ListenResponse, "registered", doing, timeout, named)
        # Only what both sides support: a sidecar that confirms no feature gets none.
        self.tool_slots = FEATURE_TOOL_SLOTS in start.features and (
            FEATURE_TOOL_SLOTS in first.registered.features
        )
        self.part_slots = FEATURE_PART_SLOTS in start.features and (
            FEATURE_PART_SLOTS in first.registered.features
        )
        self.callback_cache = FEATURE_CALLBACK_CACHE in first.registered.features
        self._stream.call = call
        self._reader = asyncio.create_task(self._stream.read(self._ended))
        return str(first.registered.registration_id)

    async def invalidate(self, timeout: float) -> None:
        """Drop the sidecar's cached results of this listener; done once it confirms
        (within `timeout`). A sidecar without the feature caches nothing to drop."""
        reading = self._reader is not None and not self._reader.done()
        if self.callback_cache and reading and not self._closing:
            await self._stream.invalidations.invalidate(self._write_invalidate, timeout)

    async def _write_invalidate(self, invalidate: pb.CacheInvalidate) -> None:
        await self._stream.write(pb.ListenRequest(invalidate=invalidate))

    async def end(self, timeout: float) -> bool:
        """Dispose the listener through its own stream: half-closed, the sidecar disposes
        it and then ends the stream with OK. True once that end came within `timeout`: the
        listener is gone, no assembly sees it any more. False when the stream was over
        already, ended otherwise (the listener may be away, not gone) or not in time: then
        it is for a Dispose to say. The stream is closed here either way."""
        reader = self._reader
        if reader is None or reader.done() or self._closing:
            await self.close()
            return False
        self._closing = True  # its end is this client's: nothing to install again
        # off() called by the listener itself: its invocation is cancelled by the end it waits for
        own = self._stream.runs(asyncio.current_task())
        ending = asyncio.ensure_future(self._half_closed(reader, timeout))
        while not ending.done():
            try:
                await asyncio.shield(ending)
            except asyncio.CancelledError:
                if not own:  # cancelled by its caller
                    ending.cancel()
                    await self.close()
                    raise
        ended = reader.done() and not reader.cancelled() and reader.exception() is None
        ended = ended and not self._stream.end_reason  # OK: the sidecar disposed it
        await self.close()
        return ended

    async def _half_closed(self, reader: asyncio.Task[None], timeout: float) -> None:
        """Half-close the stream (answers written before go first) and wait for its end."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError, TimeoutError):
            async with asyncio.timeout(timeout):
                await self._stream.done_writing()
                await asyncio.wait([reader])  # a wait cut short leaves the reader to close()

    async def close(self) -> None:
        self._closing = True
        self._stream.cancel_all()
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    def _ended(self) -> None:
        if self._closing:
            return
        if self._ejected:
            self._on_ejected(self._ejected)  # it did not answer in time: installed again
        else:  # the stream ended under it: installed again on the same session
            self._on_lost(self._stream.end_reason or "its stream ended")

    def _ejected_by_sidecar(self, ejected: pb.CallbackEjected) -> None:
        self._ejected = ejected.message or ejected.reason or "ejected"

    def _start(self, invocation: pb.ListenerInvocation) -> None:
        if self._closing:
            return  # off() half-closed the stream: its end fails this invocation
        # Read here, in the stream's order: each invocation is the base of the next.
        invocation_id = invocation.invocation_id
        slots = invocation.slots if self.part_slots else pb.PartSlots()
        try:
            parts = Parts.received(invocation.assembly, slots, self._base)
        except SystemPromptError as error:
            self._base = None
            refused = error  # the except clause unbinds `error`; the task runs later
            self._stream.start(invocation_id, lambda: self._refuse(invocation_id, refused))
            return
        if self.part_slots:
            self._base = parts
        slotted: Slotted = "parts" if self.part_slots else "tools" if self.tool_slots else None
        running = Invocation(parts, slotted)
        self._stream.start(invocation_id, lambda: self._invoke(invocation, running))

    async def _refuse(self, invocation_id: int, error: SystemPromptError) -> None:
        """An invocation whose slots cannot be right: this stream's base is lost, so the
        invocation fails and the stream is closed, which ends it and installs the
        listener again (half-closed, not cancelled, so that the failure arrives first)."""
        failure = pb.ListenerFailure(invocation_id=invocation_id, message=str(error))
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._stream.write(pb.ListenRequest(failure=failure))  # written, then closed
            if self._call is not None:
                await self._call.done_writing()

    def _next_result(self, result: pb.ListenerNextResult) -> None:
        waiting = self._next_results.get(result.invocation_id)
        if waiting is not None and not waiting.done():  # else: nobody waits for it
            waiting.set_result(result)

    def _cancel(self, cancel: pb.ListenerCancel) -> None:
        self._stream.cancel(cancel.invocation_id)

    async def _invoke(self, invocation: pb.ListenerInvocation, sent: Invocation) -> None:
        with span(f'listener "{self._name}"', invocation.trace_context):
            await self._answer(invocation, sent)

    async def _answer(self, invocation: pb.ListenerInvocation, sent: Invocation) -> None:
        invocation_id = invocation.invocation_id
        assembly = sent.view()
        next_ = _Next(NextCall(self, invocation_id, assembly, sent))
        try:
            result = await self._listener(assembly, context_from_proto(invocation.context), next_)
            if isinstance(result, NextCall) and not result.started:
                # `return next()` without awaiting: a tail call, one round trip.
                await result.send(tail=True)
                return
            if not isinstance(result, PromptAssembly):
                raise TypeError(f"a listener must return a PromptAssembly, not {result!r}")
            message, slots = sent.encode(result)
            reply = pb.ListenRequest(
                result=pb.ListenerResult(invocation_id=invocation_id, assembly=message, **slots)
            )
        except asyncio.CancelledError:
            return  # the sidecar abandoned this invocation
        except Exception as error:  # the listener's failure fails the assembly, not us
            reply = pb.ListenRequest(
                failure=pb.ListenerFailure(
                    invocation_id=invocation_id, message=f"{type(error).__name__}: {error}"
                )
            )
        await self._write(reply)

    async def _next(
        self, invocation_id: int, handed: PromptAssembly, sent: Invocation, tail: bool
    ) -> PromptAssembly | None:
        assembly, slots = sent.encode(handed)
        message = pb.ListenRequest(
            next=pb.ListenerNext(invocation_id=invocation_id, assembly=assembly, tail=tail, **slots)
        )
        if tail:
            await self._write(message)
            return None
        waiting: asyncio.Future[pb.ListenerNextResult] = asyncio.get_running_loop().create_future()
        self._next_results[invocation_id] = waiting
        try:
            await self._write(message)
            returned = await waiting
            return sent.decode(returned.assembly, returned.slots, returned.tool_slots)
        finally:
            del self._next_results[invocation_id]

    async def _write(self, message: pb.ListenRequest) -> None:
        self._stream.send(message)  # started now, never awaited: no suspension here


class NextCall:
    """What `next()` returns: await it for the rest of the chain's result, or
    return it un-awaited (`return next()`) to hand that result on untouched,
    which saves the sidecar a round trip."""

    def __init__(
        self, stream: ListenerStream, invocation_id: int, handed: PromptAssembly, sent: Invocation
    ) -> None:
        self._stream = stream
        self._invocation_id = invocation_id
        self._handed = handed
        self._sent = sent
        self.started = False

    def __await__(self) -> Generator[Any, None, PromptAssembly]:
        return self._run().__await__()

    async def _run(self) -> PromptAssembly:
        self.started = True
        result = await self._stream._next(self._invocation_id, self._handed, self._sent, tail=False)
        assert result is not None
        return result

    async def send(self, tail: bool) -> None:
        self.started = True
        await self._stream._next(self._invocation_id, self._handed, self._sent, tail=tail)

    def handing(self, handed: PromptAssembly) -> NextCall:
        """The same call, handing the rest of the chain `handed` instead."""
        return NextCall(self._stream, self._invocation_id, handed, self._sent)


class _Next:
    """The `next` a listener receives; callable once per invocation."""

    def __init__(self, call: NextCall) -> None:
        self._call = call  # handing on the assembly as the listener received it
        self._called = False

    def __call__(self, handed: PromptAssembly | None = None) -> NextCall:
        if self._called:
            raise SystemPromptError(
                "next() may be called once per invocation",
                grpc.StatusCode.FAILED_PRECONDITION,
                Reason.LISTENER_FAILED,
            )
        self._called = True
        return self._call if handed is None else self._call.handing(handed)
