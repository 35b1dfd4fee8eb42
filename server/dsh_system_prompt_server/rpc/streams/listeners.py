"""Listener streams: one waterfall listener per bidi stream, from install to disposal."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence

import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import FEATURE_CALLBACK_CACHE, FEATURE_TOOL_SLOTS, Reason

from ...registry import (
    AssembleContext,
    Assembly,
    Failure,
    NextFn,
    Registry,
    RegistryError,
    ServiceError,
    Status,
    Tool,
)
from ...telemetry.logs import logger
from ...telemetry.metrics import Metrics
from ...telemetry.tracing import Tracing, hop
from ..convert import (
    assembly_from_proto,
    assembly_to_proto,
    assembly_to_slotted_proto,
    cache_from_proto,
    context_to_proto,
)
from ..gate import Gate
from ..status import bad_request
from .outbox import Outbox, OutboxLimits
from .sessions import Sessions, Stream

_log = logger("listeners")

# What this sidecar can do on a listener stream, when the client says it can too.
LISTENER_FEATURES = frozenset({FEATURE_TOOL_SLOTS, FEATURE_CALLBACK_CACHE})


ListenStream = Stream[pb.ListenResponse]


class Listeners:
    """Listen streams' life cycle: install the listener, route replies, dispose at the end."""

    def __init__(
        self,
        registry: Registry,
        sessions: Sessions,
        metrics: Metrics,
        outbox: OutboxLimits | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._registry = registry
        self._sessions = sessions
        self._metrics = metrics
        self._tracing = tracing
        self.outbox_limits = outbox or OutboxLimits()  # for streams opened from now on

    async def serve(self, stream: ListenStream, gate: Gate) -> None:
        """One Listen stream, start to end: the start message installs the listener
        (through `gate`) until the client closes the stream or the listener is disposed.

        Raises a Failure before the listener is installed (a bad start, a refusal), and
        STREAM_STALLED when the client stopped reading (the listener is disposed).
        """
        first = await stream.read()
        if not isinstance(first, pb.ListenRequest) or not first.HasField("start"):
            raise bad_request(Reason.BAD_STREAM, "a listener must start with ListenStart")
        start = first.start
        features = [name for name in start.features if name in LISTENER_FEATURES]
        outbox = Outbox(stream.write, self.outbox_limits, f'listener "{start.name[:64]}"')
        listener = ListenerStream(
            start.name, outbox, tool_slots=FEATURE_TOOL_SLOTS in features, tracing=self._tracing
        )
        with gate.call():
            owner = self._sessions.get(start.session_id).id
            entry = self._registry.add_listener(
                owner,
                start.scope_id or None,
                listener,
                prepend=start.prepend,
                global_=getattr(start, "global"),  # a Python keyword: no attribute syntax
                name=start.name,
                cache=cache_from_proto(start.cache),
            )

        def invalidate(request: pb.CacheInvalidate) -> None:
            self._registry.invalidate_listener(owner, entry.id)
            done = pb.CacheInvalidated(invalidate_id=request.invalidate_id)
            outbox.send(pb.ListenResponse(invalidated=done))

        listener.on_invalidate = invalidate
        writer = asyncio.create_task(outbox.run())
        reader = asyncio.create_task(_route(stream, listener))
        ended = asyncio.create_task(listener.ended.wait())
        try:
            registered = pb.ListenerRegistered(
                registration_id=entry.id, revision=self._registry.revision, features=features
            )
            outbox.send(pb.ListenResponse(registered=registered))
            done, _ = await asyncio.wait(
                {reader, ended, writer}, return_when=asyncio.FIRST_COMPLETED
            )
            if reader in done:
                reader.result()  # what ended the stream, if it failed
        finally:
            for task in (reader, ended, writer):
                task.cancel()
            listener.end()
            with contextlib.suppress(RegistryError):  # already disposed, or with its session
                self._registry.dispose(owner, entry.id)
        if outbox.stalled.is_set():
            _log.warning("disposed listener %s: %s", listener.name[:64], outbox.stall_reason)
            self._metrics.peer_stalled("listener")
            raise outbox.stall_error()


class ListenerStream:
    """Runs invocations of one listener over its stream (a registry ListenerHost)."""

    def __init__(
        self,
        name: str,
        outbox: Outbox[pb.ListenResponse],
        *,
        tool_slots: bool = False,
        tracing: Tracing | None = None,
    ) -> None:
        self.name = name or "(unnamed)"
        self._tracing = tracing
        self._tool_slots = tool_slots  # the client decodes slots in next results
        self._outbox = outbox
        self._inboxes: dict[int, asyncio.Queue[pb.ListenRequest | None]] = {}
        self._invocation_ids = itertools.count(1)
        self.ended = asyncio.Event()
        self.messages_sent = 0  # invocations, next results and cancels, for round-trip counts
        self.on_invalidate: Callable[[pb.CacheInvalidate], None] = lambda _: None

    async def invoke(
        self, assembly: Assembly, context: AssembleContext, next_: NextFn, timeout: float | None
    ) -> Assembly:
        if self.ended.is_set():
            raise self._unavailable()
        invocation = pb.ListenerInvocation(
            invocation_id=next(self._invocation_ids),
            assembly=assembly_to_proto(assembly),
            context=context_to_proto(context),
        )
        # The hop's span holds the rest of the chain too: listeners nest as they run.
        with hop(self._tracing, f'listener "{self.name}"', invocation.trace_context):
            return await self._run(invocation, assembly.tools, next_, timeout)

    async def _run(
        self,
        invocation: pb.ListenerInvocation,
        sent: Sequence[Tool],  # what the client holds: its replies refer to these by slot
        next_: NextFn,
        timeout: float | None,
    ) -> Assembly:
        invocation_id = invocation.invocation_id
        inbox: asyncio.Queue[pb.ListenRequest | None] = asyncio.Queue()
        self._inboxes[invocation_id] = inbox
        try:
            self._send(pb.ListenResponse(invocation=invocation))
            reply = await self._receive(inbox, timeout)
            if reply.WhichOneof("kind") == "next":
                handed = self._decode(reply.next.assembly, reply.next.tool_slots, sent)
                returned = await next_(handed)
                if reply.next.tail:
                    return returned
                message, slots = (
                    assembly_to_slotted_proto(returned, sent)
                    if self._tool_slots
                    else (assembly_to_proto(returned), [])
                )
                self._send(
                    pb.ListenResponse(
                        next_result=pb.ListenerNextResult(
                            invocation_id=invocation_id, assembly=message, tool_slots=slots
                        )
                    )
                )
                reply = await self._receive(inbox, timeout)
            return self._final(reply, sent)
        except BaseException:
            self._abandon(invocation_id)
            raise
        finally:
            del self._inboxes[invocation_id]

    def deliver(self, request: pb.ListenRequest) -> None:
        """Route a message from the client to the invocation it belongs to."""
        kind = request.WhichOneof("kind")
        if kind is None or kind == "start":
            return
        if kind == "invalidate":
            self.on_invalidate(request.invalidate)
            return
        invocation_id: int = getattr(request, kind).invocation_id
        inbox = self._inboxes.get(invocation_id)
        if inbox is not None:
            inbox.put_nowait(request)

    def end(self) -> None:
        """The stream is over (closed or disposed): waiting invocations fail."""
        self.ended.set()
        for inbox in self._inboxes.values():
            inbox.put_nowait(None)

    def disposed(self) -> None:
        self.end()

    async def _receive(
        self, inbox: asyncio.Queue[pb.ListenRequest | None], timeout: float | None
    ) -> pb.ListenRequest:
        try:
            async with asyncio.timeout(timeout):
                reply = await inbox.get()
        except TimeoutError:
            raise ServiceError(
                Status.DEADLINE_EXCEEDED,
                Reason.LISTENER_TIMEOUT,
                f'listener "{self.name}" did not answer within {timeout:g}s',
            ) from None
        if reply is None:
            raise self._unavailable()
        return reply

    def _final(self, reply: pb.ListenRequest, sent: Sequence[Tool]) -> Assembly:
        kind = reply.WhichOneof("kind")
        if kind == "result":
            return self._decode(reply.result.assembly, reply.result.tool_slots, sent)
        if kind == "failure":
            raise self._failed(reply.failure.message)
        raise self._failed("it called next() more than once")

    def _decode(
        self, message: pb.PromptAssembly, slots: Sequence[int], sent: Sequence[Tool]
    ) -> Assembly:
        try:
            return assembly_from_proto(message, slots, sent)
        except Failure as error:  # the listener broke the protocol, like a provider would
            raise self._failed(error.message) from None

    def _send(self, message: pb.ListenResponse) -> None:
        """Queue `message` on the stream (its outbox writes it; this never waits)."""
        if self.ended.is_set() or not self._outbox.send(message):
            raise self._unavailable()
        self.messages_sent += 1

    def _abandon(self, invocation_id: int) -> None:
        if self.ended.is_set():
            return
        with contextlib.suppress(ServiceError):  # the stream may be going away
            self._send(pb.ListenResponse(cancel=pb.ListenerCancel(invocation_id=invocation_id)))

    def _failed(self, why: str) -> ServiceError:
        return ServiceError(
            Status.ABORTED, Reason.LISTENER_FAILED, f'listener "{self.name}" failed: {why}'
        )

    def _unavailable(self) -> ServiceError:
        return ServiceError(
            Status.UNAVAILABLE,
            Reason.LISTENER_UNAVAILABLE,
            f'listener "{self.name}" is unavailable: its stream has closed',
        )


async def _route(stream: ListenStream, listener: ListenerStream) -> None:
    while (request := await stream.read()) is not grpc.aio.EOF:
        if isinstance(request, pb.ListenRequest):
            listener.deliver(request)
