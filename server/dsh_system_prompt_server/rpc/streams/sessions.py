"""Sessions: the streams that own registrations and answer for dynamic providers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import FEATURE_CALLBACK_CACHE, Reason, package_version

from ...registry import (
    AssembleContext,
    ProvidedValue,
    ProviderCall,
    Registry,
    ServiceError,
    Status,
    new_id,
)
from ...registry.limits import quota_exceeded
from ...telemetry.logs import logger
from ...telemetry.metrics import Metrics
from ...telemetry.tracing import Tracing, hop
from ..convert import provide_request, provided_from_proto
from ..gate import Gate
from ..status import bad_request, unknown_session
from .outbox import Outbox, OutboxLimits
from .peers import PeerCounts

Out = TypeVar("Out", contravariant=True)
SIDECAR_VERSION = f"dsh-system-prompt/{package_version()}"
# What this sidecar can do on a session stream, when the client says it can too.
SESSION_FEATURES = frozenset({FEATURE_CALLBACK_CACHE})
_log = logger("sessions")


class Stream(Protocol[Out]):
    """The reader/writer half of a bidi call's servicer context (OpenSession, Listen)."""

    async def read(self) -> object:
        """The next request, or grpc.aio.EOF once the client has closed its side."""
        ...

    async def write(self, message: Out) -> None: ...

    def peer(self) -> str:
        """The peer's address as gRPC names it, e.g. `ipv4:127.0.0.1:53210` or `unix:`."""
        ...


SessionStream = Stream[pb.OpenSessionResponse]


class Session:
    """One client session; evaluates its dynamic providers over its stream."""

    def __init__(
        self, session_id: str, client_name: str, outbox: Outbox[pb.OpenSessionResponse],
        peer: str = "", tracing: Tracing | None = None,
    ) -> None:  # fmt: skip
        self.id = session_id
        self.tracing = tracing
        self.client_name = client_name
        self.peer = peer
        self.outbox = outbox
        self.closed = False
        self.provide_requests = 0  # one per assembly that needed this session
        self._pending: dict[int, asyncio.Future[pb.ProvideResponse]] = {}
        self._call_ids = itertools.count(1)

    async def provide(
        self, calls: Sequence[ProviderCall], context: AssembleContext, timeout: float | None
    ) -> Mapping[str, ProvidedValue]:
        """Ask the client for every value in `calls` with one message."""
        if self.closed:
            raise _unavailable(calls)
        call_id = next(self._call_ids)
        self.provide_requests += 1
        request = provide_request(call_id, calls, context, timeout)
        with hop(self.tracing, _describe(calls), request.provide.trace_context):
            return await self._ask(request, calls, timeout)

    async def _ask(
        self, request: pb.OpenSessionResponse, calls: Sequence[ProviderCall], timeout: float | None
    ) -> Mapping[str, ProvidedValue]:
        call_id = request.provide.call_id
        if not self.outbox.send(request):
            raise _unavailable(calls)
        answer: asyncio.Future[pb.ProvideResponse] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = answer
        try:
            async with asyncio.timeout(timeout):
                response = await answer
        except TimeoutError:
            self._cancel(call_id)
            raise ServiceError(
                Status.DEADLINE_EXCEEDED,
                Reason.PROVIDER_TIMEOUT,
                f"{_describe(calls)} did not answer within {timeout:g}s",
            ) from None
        except _SessionGone:
            raise _unavailable(calls) from None
        except asyncio.CancelledError:
            self._cancel(call_id)
            raise
        finally:
            self._pending.pop(call_id, None)
        return provided_from_proto(calls, response)

    def deliver(self, response: pb.ProvideResponse) -> None:
        """Hand an answer from the stream to the assembly waiting for it."""
        waiting = self._pending.get(response.call_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(response)

    def close(self) -> None:
        """The stream ended: every waiting assembly fails UNAVAILABLE."""
        self.closed = True
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(_SessionGone())
        self._pending.clear()

    def _cancel(self, call_id: int) -> None:
        if not self.closed:
            self.outbox.send(pb.OpenSessionResponse(cancel=pb.ProvideCancel(call_id=call_id)))


class _SessionGone(Exception):
    pass


class Sessions:
    """The open sessions and their streams' life cycle; closing one disposes what it registered."""

    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        max_sessions: int = 1_000,
        max_per_peer: int = 100,
        outbox: OutboxLimits | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._tracing = tracing
        self._max_sessions = max_sessions
        self._per_peer = PeerCounts(max_per_peer)
        self.outbox_limits = outbox or OutboxLimits()  # for streams opened from now on
        self._open: dict[str, Session] = {}

    def set_limits(self, max_sessions: int, max_per_peer: int) -> None:
        """New quotas for sessions opened from now on (open ones stay)."""
        self._max_sessions = max_sessions
        self._per_peer.limit = max_per_peer

    async def serve(self, stream: SessionStream, gate: Gate) -> None:
        """One OpenSession stream, start to end: the start message opens a session (through
        `gate`), answers flow to waiting assemblies, and the stream's end closes it.

        Raises a Failure before the session is opened (a bad start, a full sidecar), and
        STREAM_STALLED when the client stopped reading (the session is closed).
        """
        first = await stream.read()
        if not isinstance(first, pb.OpenSessionRequest) or not first.HasField("start"):
            raise bad_request(Reason.BAD_STREAM, "a session must start with SessionStart")
        client_name = first.start.client_name
        self._registry.limits.check_name("client", client_name)
        outbox = Outbox(stream.write, self.outbox_limits, "the session")
        with gate.call():
            session = self.open(client_name, outbox, stream.peer())
        writer = asyncio.create_task(outbox.run())
        reader = asyncio.create_task(_route(stream, session, self._registry))
        try:
            opened = pb.SessionOpened(
                session_id=session.id,
                revision=self._registry.revision,
                sidecar_version=SIDECAR_VERSION,
                features=[name for name in first.start.features if name in SESSION_FEATURES],
            )
            outbox.send(pb.OpenSessionResponse(opened=opened))
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                reader.result()  # what ended the stream, if it failed
        finally:
            reader.cancel()
            writer.cancel()
            self.close(session)
        if outbox.stalled.is_set():
            _log.warning("closed session %s (%s): %s", session.id, client_name[:64],
                         outbox.stall_reason)  # fmt: skip
            self._metrics.peer_stalled("session")
            raise outbox.stall_error()

    def open(
        self, client_name: str, outbox: Outbox[pb.OpenSessionResponse], peer: str = ""
    ) -> Session:
        if len(self._open) >= self._max_sessions:
            raise quota_exceeded(f"the sidecar already has {len(self._open)} sessions, its limit")
        self._per_peer.admit(peer)
        session = Session(new_id(), client_name, outbox, peer, self._tracing)
        self._open[session.id] = session
        return session

    def client_name(self, session_id: str) -> str:
        """The client name an open session started with; "" for any other id."""
        session = self._open.get(session_id)
        return "" if session is None else session.client_name

    def get(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is None:
            raise unknown_session()
        return session

    def close(self, session: Session) -> None:
        if self._open.pop(session.id, None) is None:
            return
        self._per_peer.release(session.peer)
        session.close()
        self._registry.dispose_owner(session.id)

    def __len__(self) -> int:
        return len(self._open)

    def all(self) -> list[Session]:
        """The open sessions, oldest first."""
        return list(self._open.values())


async def _route(stream: SessionStream, session: Session, registry: Registry) -> None:
    while (request := await stream.read()) is not grpc.aio.EOF:
        if not isinstance(request, pb.OpenSessionRequest):
            continue
        kind = request.WhichOneof("kind")
        if kind == "provided":
            session.deliver(request.provided)
        elif kind == "invalidate":
            registry.invalidate_providers(session.id, set(request.invalidate.provider_keys))
            done = pb.CacheInvalidated(invalidate_id=request.invalidate.invalidate_id)
            session.outbox.send(pb.OpenSessionResponse(invalidated=done))


def _describe(calls: Sequence[ProviderCall]) -> str:
    return ", ".join(call.describe() for call in calls)


def _unavailable(calls: Sequence[ProviderCall]) -> ServiceError:
    return ServiceError(
        Status.UNAVAILABLE,
        Reason.PROVIDER_UNAVAILABLE,
        f"{_describe(calls)} unavailable: the session that registered it has ended",
    )
