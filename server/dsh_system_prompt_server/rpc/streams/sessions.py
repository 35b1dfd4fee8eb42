"""Sessions: the streams that own registrations and answer for dynamic providers."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import (
    FEATURE_CALLBACK_CACHE,
    FEATURE_EACH_ANSWER,
    Reason,
    package_version,
)

from ...guard import client_of
from ...registry import (
    Client,
    ClientCounts,
    Exchange,
    Failure,
    Limits,
    ProvidedValue,
    ProviderCall,
    Registry,
    ServiceError,
    Status,
    new_id,
    quota_exceeded,
)
from ...telemetry import Metrics, hop, logger
from ...wire import ProvideRequests, provided_from_proto, unknown_session
from .broker import Broker, Ended, Replies, Stream
from .flag import Flag
from .outbox import Outbox, OutboxLimits

if TYPE_CHECKING:
    from ...telemetry import Tracing

# What this sidecar can do on a session stream, when the client says it can too.
_log = logger("streams")
SESSION_FEATURES = frozenset({FEATURE_CALLBACK_CACHE, FEATURE_EACH_ANSWER})
SessionStream = Stream[pb.OpenSessionResponse]
_DEFAULT_LIMITS = Limits()


class Session:
    """One client session; evaluates its dynamic providers over its stream."""

    def __init__(
        self,
        session_id: str,
        client_name: str,
        outbox: Outbox[pb.OpenSessionResponse],
        peer: str = "",
        tracing: Tracing | None = None,
        limits: Limits = _DEFAULT_LIMITS,
        client: Client | None = None,
        requests: ProvideRequests | None = None,
    ) -> None:
        self.id = session_id
        self.requests = ProvideRequests() if requests is None else requests  # shared by all
        self.limits = limits  # what its answers are checked against
        self.tracing = tracing
        self.client_name = client_name
        self.peer = peer
        self.client = client  # what its quota is counted against
        self.outbox = outbox
        self.ended = Flag()
        self.provide_requests = 0  # one per assembly that needed this session
        self.each_answer = False  # its client answers provider by provider (its feature)
        self._replies: Replies[pb.ProvideResponse] = Replies()  # no __orig_class__ kept
        self._call_ids = itertools.count(1)
        self.on_invalidate: Callable[[pb.CacheInvalidate], None] = lambda _: None

    @property
    def label(self) -> str:
        return f"{self.id} ({self.client_name[:64]})"

    async def provide(self, exchange: Exchange) -> Mapping[str, ProvidedValue | Failure]:
        """Ask the client for every value in the exchange's calls with one message. A client
        that answers provider by provider (`each-answer`) has each call judged against its
        own time (`times`): the answers that came are taken, and only a provider that did
        not answer in its time fails, PROVIDER_TIMEOUT, naming it."""
        calls = exchange.calls
        if self.ended.is_set():
            raise _unavailable(calls)
        call_id = next(self._call_ids)
        self.provide_requests += 1
        trace_context: dict[str, str] = {}  # the hop's span, when the sidecar traces
        name = "" if self.tracing is None else _describe(calls)
        with hop(self.tracing, name, trace_context):
            request = self.requests.encode(
                call_id, calls, exchange.context, exchange.timeout, trace_context
            )
            return await self._ask(call_id, request, exchange)

    async def _ask(
        self,
        call_id: int,
        request: bytes,
        exchange: Exchange,
    ) -> Mapping[str, ProvidedValue | Failure]:
        calls, timeout = exchange.calls, exchange.timeout
        try:  # past the stream's bound it waits for the client's reads to make room
            queued = await self.outbox.put(lambda: request, timeout)
        except TimeoutError:
            raise ServiceError(
                Status.UNAVAILABLE,
                Reason.PROVIDER_UNAVAILABLE,
                f"{_describe(calls)} unavailable: its session's stream had no room for the"
                f" request within {timeout:g}s (others are queued ahead of it)",
            ) from None
        if not queued:
            raise _unavailable(calls)
        self._replies.open(call_id)
        try:
            if self.each_answer:
                return await self._each(call_id, calls, exchange.times)
            response = await self._replies.next(call_id, timeout)
        except TimeoutError:
            self._cancel(call_id)
            raise ServiceError(
                Status.DEADLINE_EXCEEDED,
                Reason.PROVIDER_TIMEOUT,
                f"{_describe(calls)} did not answer within {timeout:g}s",
            ) from None
        except Ended:
            raise _unavailable(calls) from None
        except asyncio.CancelledError:
            self._cancel(call_id)
            raise
        finally:
            self._replies.close(call_id)
        return self._provided(calls, response, partial=False)

    def _provided(
        self, calls: Sequence[ProviderCall], response: pb.ProvideResponse, partial: bool
    ) -> dict[str, ProvidedValue | Failure]:
        """The values of one answer; a provider whose answer was too large to send is
        logged (its assembly fails naming it, and the session lives on)."""
        for value in response.values:
            if value.WhichOneof("value") == "error" and value.error.answer_bytes:
                _log.warning(
                    "session %s: provider %r answered %d bytes, over the largest message read;"
                    " its assembly fails",
                    self.label,
                    value.provider_key[:64],
                    value.error.answer_bytes,
                )
        return provided_from_proto(calls, response, self.limits, partial)

    async def _each(
        self, call_id: int, calls: Sequence[ProviderCall], times: Mapping[str, float]
    ) -> Mapping[str, ProvidedValue | Failure]:
        """Take the client's answers as they come, provider by provider, until each call
        is answered or its own time is up (as HTTP/2 streams each end on their own, not
        with the slowest of the connection)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        waiting = {call.key: call for call in calls}
        values: dict[str, ProvidedValue | Failure] = {}
        while waiting:
            now = loop.time()
            for key in [key for key in waiting if start + times[key] <= now]:
                call = waiting.pop(key)
                values[key] = ServiceError(
                    Status.DEADLINE_EXCEEDED,
                    Reason.PROVIDER_TIMEOUT,
                    f"{call.describe()} did not answer within {times[key]:g}s",
                )
            if not waiting:
                break
            first = min(start + times[key] for key in waiting)
            try:
                response = await self._replies.next(call_id, first - now)
            except TimeoutError:
                continue
            answered = self._provided(list(waiting.values()), response, partial=True)
            for key, value in answered.items():
                values[key] = value
                del waiting[key]
        if any(
            isinstance(value, Failure) and value.reason == Reason.PROVIDER_TIMEOUT
            for value in values.values()
        ):
            self._cancel(call_id)  # those still running: their answers would go nowhere
        return values

    def deliver(self, request: pb.OpenSessionRequest) -> None:
        """Take a message from the stream: an answer for the assembly waiting for it, or an
        invalidation."""
        kind = request.WhichOneof("kind")
        if kind == "provided":
            self._replies.deliver(request.provided.call_id, request.provided)
        elif kind == "invalidate":
            self.on_invalidate(request.invalidate)

    def ejected(self, registration_id: str, why: Failure) -> None:
        """One of its providers did not answer in time and was disposed: say so."""
        told = pb.CallbackEjected(
            registration_id=registration_id, reason=why.reason, message=why.message
        )
        self.outbox.send(pb.OpenSessionResponse(ejected=told))

    def close(self) -> None:
        """The stream ended: every waiting assembly fails UNAVAILABLE."""
        self.ended.set()
        self._replies.end()

    def _cancel(self, call_id: int) -> None:
        if not self.ended.is_set():
            self.outbox.send(pb.OpenSessionResponse(cancel=pb.ProvideCancel(call_id=call_id)))


class Sessions(Broker[pb.OpenSessionRequest, pb.OpenSessionResponse, Session]):
    """The open sessions and their streams; closing one disposes what it registered."""

    kind = "session"
    request = pb.OpenSessionRequest
    must_start = "a session must start with SessionStart"

    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        max_sessions: int = 1_000,
        max_per_peer: int = 100,
        outbox: OutboxLimits | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        super().__init__(registry, metrics, outbox, tracing)
        self._max_sessions = max_sessions
        self._per_client = ClientCounts(max_per_peer)
        self._open: dict[str, Session] = {}
        self._requests = ProvideRequests()
        self.max_message_bytes = 0  # the largest message read, told to clients (0: not told)

    def set_limits(self, max_sessions: int, max_per_peer: int) -> None:
        """New quotas for sessions opened from now on (open ones stay)."""
        self._max_sessions = max_sessions
        self._per_client.limit = max_per_peer

    def peer_name(self, start: pb.OpenSessionRequest) -> str:
        return "the session"

    def open(
        self, start: pb.OpenSessionRequest, outbox: Outbox[pb.OpenSessionResponse], peer: str
    ) -> tuple[Session, pb.OpenSessionResponse]:
        """A session for the client `start` names, and its SessionOpened; QUOTA_EXCEEDED
        when the sidecar or the client (`client_of`) holds as many as it may."""
        client_name = start.start.client_name
        self._registry.limits.check_name("client", client_name)
        self._registry.limits.check_count("session start features", len(start.start.features))
        if len(self._open) >= self._max_sessions:
            raise quota_exceeded(f"the sidecar already has {len(self._open)} sessions, its limit")
        client = client_of(peer)
        self._per_client.admit(client)
        limits = self._registry.limits
        session = Session(
            new_id(),
            client_name,
            outbox,
            peer,
            self._tracing,
            limits,
            client,
            requests=self._requests,
        )
        session.each_answer = FEATURE_EACH_ANSWER in start.start.features
        # what it uses, not the session: a closure over it left an ended stream to the collector
        session.on_invalidate = functools.partial(self._invalidate, session.id, outbox)
        # its bytes and listeners count against its client; a session whose client the
        # sidecar cannot tell apart (a unix socket without credentials) is its own client
        owner = client or Client(f"session:{session.id}", f"the session {session.id}")
        self._registry.clients.bind(session.id, owner)
        self._open[session.id] = session
        opened = pb.SessionOpened(
            session_id=session.id,
            revision=self._registry.revision,
            sidecar_version=f"dsh-system-prompt/{package_version()}",
            features=[name for name in start.start.features if name in SESSION_FEATURES],
            max_message_bytes=self.max_message_bytes,
        )
        return session, pb.OpenSessionResponse(opened=opened)

    def _invalidate(
        self,
        session_id: str,
        outbox: Outbox[pb.OpenSessionResponse],
        request: pb.CacheInvalidate,
    ) -> None:
        limits = self._registry.limits  # a count over it ends the stream with its status
        limits.check_count("cache invalidation provider_keys", len(request.provider_keys))
        self._registry.invalidate_providers(session_id, set(request.provider_keys))
        done = pb.CacheInvalidated(invalidate_id=request.invalidate_id)
        outbox.send(pb.OpenSessionResponse(invalidated=done))

    def client_name(self, session_id: str) -> str:
        """The client name an open session started with; "" for any other id."""
        session = self._open.get(session_id)
        return "" if session is None else session.client_name

    def is_open(self, session_id: str) -> bool:
        return session_id in self._open

    def get(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is None:
            raise unknown_session()
        return session

    def close(self, session: Session) -> None:
        if self._open.pop(session.id, None) is None:
            return
        self._per_client.release(session.client)
        session.close()
        self._registry.dispose_owner(session.id)

    def __len__(self) -> int:
        return len(self._open)

    def all(self) -> list[Session]:
        """The open sessions, oldest first."""
        return list(self._open.values())


def _describe(calls: Sequence[ProviderCall]) -> str:
    return ", ".join(call.describe() for call in calls)


def _unavailable(calls: Sequence[ProviderCall]) -> ServiceError:
    return ServiceError(
        Status.UNAVAILABLE,
        Reason.PROVIDER_UNAVAILABLE,
        f"{_describe(calls)} unavailable: the session that registered it has ended",
    )
