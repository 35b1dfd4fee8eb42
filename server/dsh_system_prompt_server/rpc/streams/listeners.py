"""Listener streams: one waterfall listener per bidi stream, from install to disposal."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import (
    FEATURE_CALLBACK_CACHE,
    FEATURE_PART_SLOTS,
    FEATURE_TOOL_SLOTS,
    Reason,
)

from ...registry import (
    AssembleContext,
    Assembly,
    Failure,
    NextFn,
    Registry,
    RegistryError,
    ServiceError,
    Status,
)
from ...telemetry import Metrics, hop
from ...wire import (
    cache_from_proto,
    context_to_proto,
    failure_policy_from_proto,
    timeout_from_proto,
)
from . import encoded
from .broker import Broker, Ended, Replies, Stream
from .flag import Flag
from .outbox import Outbox, OutboxLimits
from .part_slots import Reference
from .sessions import Sessions

if TYPE_CHECKING:
    from ...telemetry import Tracing

# What this sidecar can do on a listener stream, when the client says it can too.
LISTENER_FEATURES = frozenset({FEATURE_TOOL_SLOTS, FEATURE_CALLBACK_CACHE, FEATURE_PART_SLOTS})


ListenStream = Stream[pb.ListenResponse]
_Place = tuple[str, str, bool, bool]  # a listener's name, scope id, global and prepend


class Listeners(Broker[pb.ListenRequest, pb.ListenResponse, "ListenerStream"]):
    """Listen streams: the start installs the listener, and the stream's end disposes it.

    Unless the sidecar itself closed the stream (its peer stopped reading) while the
    owner's session lives: the listener is then away, not gone. It stays in its place
    for at most `away_s` (the owner's dead-peer bound: a client that is gone loses its
    session by then), and every assembly it would see hears that it is unavailable
    (LISTENER_UNAVAILABLE: one under FAIL fails, one under IGNORE is named in
    `skipped`), never that it is silently absent (a redaction listener missing from a
    bystander's assemblies). The same session installing a listener of the same name in
    the same place (its client re-installing the lost stream) takes its place at once.
    """

    kind = "listener"
    request = pb.ListenRequest
    must_start = "a listener must start with ListenStart"

    def __init__(
        self,
        registry: Registry,
        sessions: Sessions,
        metrics: Metrics,
        outbox: OutboxLimits | None = None,
        tracing: Tracing | None = None,
        away_s: float = 0.0,
    ) -> None:
        super().__init__(registry, metrics, outbox, tracing)
        self._sessions = sessions
        self.away_s = away_s
        # listeners whose stream the sidecar closed, by registration id: owner, place, timer
        self._away: dict[str, tuple[str, _Place, asyncio.TimerHandle]] = {}

    def peer_name(self, start: pb.ListenRequest) -> str:
        return f'listener "{start.start.name[:64]}"'

    def open(
        self, start: pb.ListenRequest, outbox: Outbox[pb.ListenResponse], peer: str
    ) -> tuple[ListenerStream, pb.ListenResponse]:
        """Install the listener `start` describes, on its session; and its confirmation."""
        begin = start.start
        self._registry.limits.check_count("listener start features", len(begin.features))
        features = [name for name in begin.features if name in LISTENER_FEATURES]
        listener = ListenerStream(
            begin.name,
            outbox,
            tool_slots=FEATURE_TOOL_SLOTS in features,
            part_slots=FEATURE_PART_SLOTS in features,
            tracing=self._tracing,
        )
        owner = self._sessions.get(begin.session_id).id
        place = (begin.name, begin.scope_id, getattr(begin, "global"), begin.prepend)
        self._returned(owner, place)
        entry = self._registry.add_listener(
            owner,
            begin.scope_id or None,
            listener,
            prepend=begin.prepend,
            global_=getattr(begin, "global"),  # a Python keyword: no attribute syntax
            name=begin.name,
            cache=cache_from_proto(begin.cache),
            timeout_s=timeout_from_proto(begin.timeout_s),
            failure_policy=failure_policy_from_proto(begin.failure_policy),
        )
        listener.registration = (owner, entry.id)
        listener.place = place
        # what it uses, not the listener: a closure over it left an ended stream to the collector
        listener.on_invalidate = functools.partial(self._invalidate, listener.registration, outbox)
        registered = pb.ListenerRegistered(
            registration_id=entry.id, revision=self._registry.revision, features=features
        )
        return listener, pb.ListenResponse(registered=registered)

    def _invalidate(
        self,
        registration: tuple[str, str],
        outbox: Outbox[pb.ListenResponse],
        request: pb.CacheInvalidate,
    ) -> None:
        self._registry.invalidate_listener(*registration)
        done = pb.CacheInvalidated(invalidate_id=request.invalidate_id)
        outbox.send(pb.ListenResponse(invalidated=done))

    def close(self, listener: ListenerStream) -> None:
        listener.end()
        owner, registration_id = listener.registration
        stalled = listener.outbox.stalled.is_set() and not listener.was_disposed
        if stalled and self.away_s > 0 and self._sessions.is_open(owner):
            listener.away = listener.outbox.stall_reason
            timer = asyncio.get_running_loop().call_later(self.away_s, self._gone, registration_id)
            self._away[registration_id] = (owner, listener.place, timer)
            return
        self._dispose(owner, registration_id)

    def _returned(self, owner: str, place: _Place) -> None:
        """The session installs a listener where one of its own is away: it takes its
        place (the client re-installs a stream the sidecar closed)."""
        for registration_id, (away_owner, away_place, _) in list(self._away.items()):
            if away_owner == owner and away_place == place:
                self._gone(registration_id)

    def _gone(self, registration_id: str) -> None:
        owner, _, timer = self._away.pop(registration_id)
        timer.cancel()
        self._dispose(owner, registration_id)

    def _dispose(self, owner: str, registration_id: str) -> None:
        with contextlib.suppress(RegistryError):  # already disposed, or with its session
            self._registry.dispose(owner, registration_id)


class ListenerStream:
    """Runs invocations of one listener over its stream (a registry ListenerHost)."""

    def __init__(
        self,
        name: str,
        outbox: Outbox[pb.ListenResponse],
        *,
        tool_slots: bool = False,
        part_slots: bool = False,
        tracing: Tracing | None = None,
    ) -> None:
        self.name = name or "(unnamed)"
        self._tracing = tracing
        self._tool_slots = tool_slots  # the client decodes slots in next results
        self._part_slots = part_slots  # ... and keeps the stream's base
        self._base: Reference | None = None  # the last invocation's assembly, with part slots
        self.outbox = outbox
        self._replies: Replies[pb.ListenRequest] = Replies()  # no __orig_class__ kept
        self._invocation_ids = itertools.count(1)
        self.ended = Flag()
        self.messages_sent = 0  # invocations, next results and cancels, for round-trip counts
        self.registration = ("", "")  # (owner, registration id), once installed
        self.place: _Place = ("", "", False, False)  # name, scope id, global, prepend
        self.was_disposed = False  # the registry disposed it (not its stream's end)
        self.away = ""  # why the sidecar closed its stream, while its place is kept
        self._ejected = False  # told so: the stream ends once that is written
        self._ending: asyncio.Future[None] | None = None
        self.on_invalidate: Callable[[pb.CacheInvalidate], None] = lambda _: None

    @property
    def label(self) -> str:
        return self.name[:64]

    async def invoke(
        self, assembly: Assembly, context: AssembleContext, next_: NextFn, timeout: float | None
    ) -> Assembly:
        if self.ended.is_set():
            raise self._unavailable()
        head = pb.ListenerInvocation(
            invocation_id=next(self._invocation_ids), context=context_to_proto(context)
        )
        # The hop's span holds the rest of the chain too: listeners nest as they run.
        with hop(self._tracing, f'listener "{self.name}"', head.trace_context):
            return await self._run(head, assembly, next_, timeout)

    def _against_base(
        self, head: pb.ListenerInvocation, assembly: Assembly
    ) -> tuple[Reference, Assembly]:
        """What the client will hold of `assembly` (the replies' reference), and what of it
        goes in full; with part slots the rest is named in `head` against the base, which
        the sent assembly becomes (invocations are written in this order). The same parts
        as the base's (a plan's kept prelude, most often) keep the base as it is."""
        if not self._part_slots:
            return Reference(assembly), assembly
        base = self._base
        if base is not None and base.holds(assembly):
            head.slots.CopyFrom(base.every_slot)
            return base, Assembly(sections=[], contexts=[], tools=[], variables={})
        sent = self._base = Reference(assembly)
        if base is None:
            return sent, assembly
        slots, fresh = base.encode(assembly)
        head.slots.CopyFrom(slots)
        return sent, fresh

    async def _run(
        self, head: pb.ListenerInvocation, assembly: Assembly, next_: NextFn, timeout: float | None
    ) -> Assembly:
        invocation_id = head.invocation_id
        held: list[Reference] = []  # what the client holds: its replies refer to it by slot

        def invocation() -> bytes:  # encoded once it may go: in the order they are written
            sent, fresh = self._against_base(head, assembly)
            held.append(sent)
            return encoded.invocation(head, fresh)

        self._replies.open(invocation_id)
        try:
            await self._put(invocation, timeout)
            sent = held[0]
            reply = await self._receive(invocation_id, timeout)
            if reply.WhichOneof("kind") == "next":
                handed = self._decode(reply.next, sent)
                returned = await next_(handed)
                if reply.next.tail:
                    return returned
                await self._put(lambda: self._next_result(invocation_id, returned, sent), timeout)
                reply = await self._receive(invocation_id, timeout)
            return self._final(reply, sent)
        except BaseException:
            if held:  # written, or on its way: the client is told to drop it
                self._abandon(invocation_id)
            raise
        finally:
            self._replies.close(invocation_id)

    def deliver(self, request: pb.ListenRequest) -> None:
        """Route a message from the client to the invocation it belongs to."""
        kind = request.WhichOneof("kind")
        if kind is None or kind == "start":
            return
        if kind == "invalidate":
            self.on_invalidate(request.invalidate)
            return
        self._replies.deliver(getattr(request, kind).invocation_id, request)

    def end(self) -> None:
        """The stream is over (closed or disposed): waiting invocations fail."""
        self.ended.set()
        self._replies.end()

    def disposed(self) -> None:
        self.was_disposed = True
        if not self._ejected:
            self.end()
            return
        self._replies.end()  # waiting invocations fail now; the stream ends once told
        self._ending = asyncio.ensure_future(self._end_when_told())

    def ejected(self, why: Failure) -> None:
        """The listener did not answer in time: tell its client before its stream ends."""
        told = pb.CallbackEjected(
            registration_id=self.registration[1], reason=why.reason, message=why.message
        )
        self._ejected = self.outbox.send(pb.ListenResponse(ejected=told))

    async def _end_when_told(self) -> None:
        await self.outbox.drained()
        self.end()

    async def _receive(self, invocation_id: int, timeout: float | None) -> pb.ListenRequest:
        try:
            return await self._replies.next(invocation_id, timeout)
        except TimeoutError:
            raise ServiceError(
                Status.DEADLINE_EXCEEDED,
                Reason.LISTENER_TIMEOUT,
                f'listener "{self.name}" did not answer within {timeout:g}s',
            ) from None
        except Ended:
            raise self._unavailable() from None

    def _next_result(self, invocation_id: int, returned: Assembly, sent: Reference) -> bytes:
        if not (self._part_slots or self._tool_slots):
            return encoded.next_result(invocation_id, returned)
        slots, fresh = sent.encode(returned, tools_only=not self._part_slots)
        return encoded.next_result(invocation_id, fresh, slots if self._part_slots else slots.tools)

    def _final(self, reply: pb.ListenRequest, sent: Reference) -> Assembly:
        kind = reply.WhichOneof("kind")
        if kind == "result":
            return self._decode(reply.result, sent)
        if kind == "failure":
            raise self._failed(reply.failure.message)
        raise self._failed("it called next() more than once")

    def _decode(self, reply: pb.ListenerNext | pb.ListenerResult, sent: Reference) -> Assembly:
        try:  # slots are read whether or not the features are in effect (docs/protocol.md)
            return sent.decode(reply.assembly, reply.slots, reply.tool_slots)
        except Failure as error:  # the listener broke the protocol, like a provider would
            raise self._failed(error.message) from None

    async def _put(self, build: Callable[[], bytes], timeout: float | None) -> None:
        """Queue the message `build()` makes once the stream has room for it (others'
        invocations ahead of it are being read): waiting past `timeout` fails only this
        assembly, LISTENER_UNAVAILABLE (no timeout of the listener's: it is reading)."""
        if self.ended.is_set():
            raise self._unavailable()
        try:
            queued = await self.outbox.put(build, timeout)
        except TimeoutError:
            raise ServiceError(
                Status.UNAVAILABLE,
                Reason.LISTENER_UNAVAILABLE,
                f'listener "{self.name}" is unavailable: its stream had no room for this'
                f" invocation within {timeout:g}s (others are queued ahead of it)",
            ) from None
        if not queued or self.ended.is_set():
            raise self._unavailable()
        self.messages_sent += 1

    def _send(self, message: pb.ListenResponse | bytes) -> None:
        """Queue `message` on the stream (its outbox writes it; this never waits)."""
        if self.ended.is_set() or not self.outbox.send(message):
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
        why = "its stream has closed"
        if self.away:
            why = f"the sidecar closed its stream ({self.away}) and it is not installed again yet"
        return ServiceError(
            Status.UNAVAILABLE,
            Reason.LISTENER_UNAVAILABLE,
            f'listener "{self.name}" is unavailable: {why}',
        )
