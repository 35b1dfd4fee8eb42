"""The connection: one channel, one session at a time, and reconnecting when a session is lost.

It ties the parts together: the channel (`_channel`), the current session
(`_session`), the journal of registrations (`_replay`) and the dynamic
providers (`_providers`). When a session ends without the client closing it,
the connection opens a new one with backoff and replays the journal on it;
meanwhile calls fail fast with UNAVAILABLE, or wait when given a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import Reason
from google.protobuf.message import Message

from ._ejections import Reinstalls
from ._local_cache import LocalCache
from ._providers import Providers
from ._replay import Journal, ListenerRegistration, Registration, answer_error, send
from ._session import Session
from ._tracing import outgoing
from ._updates import Update
from .errors import NoAnswer, SystemPromptError, error_from_rpc

T = TypeVar("T")
_log = logging.getLogger("dsh_system_prompt")
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0
_READY_POLL_S = 1.0  # the channel's own reconnect backoff is at most 2 s (see _channel)


async def open_when_ready(connection: Connection, address: str, timeout: float) -> None:
    """Open the first session once the sidecar at `address` serves, within `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await connection.open()
                    return
                except SystemPromptError as error:
                    if error.code != grpc.StatusCode.UNAVAILABLE:
                        raise
                    _log.debug("waiting for the sidecar at %s: %r", address, error.message)
                # Wake on the channel's next connection, or poll: a READY channel to a
                # draining sidecar still refuses sessions.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(connection.channel.channel_ready(), _READY_POLL_S)
                await asyncio.sleep(_FIRST_BACKOFF_S)
    except TimeoutError:
        raise not_ready(address, timeout) from None


def not_ready(address: str, timeout: float | None) -> SystemPromptError:
    """Connecting to `address` took longer than `timeout` seconds."""
    return SystemPromptError(
        f"sidecar unavailable: no session with {address} within {timeout:g}s",
        grpc.StatusCode.UNAVAILABLE,
        Reason.SIDECAR_UNAVAILABLE,
    )


CALL_TIMEOUT_S = 10.0  # for what the sidecar answers at once: stream opens, registrations


class Connection:
    """Owns the channel, the current session, the journal and the providers."""

    def __init__(
        self, channel: grpc.aio.Channel, client_name: str, call_timeout: float = CALL_TIMEOUT_S
    ) -> None:
        self.channel = channel
        self.call_timeout = call_timeout
        self.stub = pb_grpc.SystemPromptServiceStub(channel)
        self.client_name = client_name
        self.providers = Providers()
        self.journal = Journal()
        self.closed = False
        self.connected = asyncio.Event()
        self.local: LocalCache | None = None  # connect(local_cache=True)'s
        self._session: Session | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self.reinstalls = Reinstalls(self._reinstall)

    @property
    def session_id(self) -> str:
        """The current session's id; the lost one's until a new one is open."""
        return "" if self._session is None else self._session.id

    # -- life cycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Open the first session; fails when the sidecar cannot be reached."""
        await self._start_session()
        self.connected.set()

    async def close(self) -> None:
        """End the session: the sidecar disposes everything it registered."""
        if self.closed:
            return
        self.closed = True
        self.connected.clear()
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnecting
        await self.reinstalls.close()
        await self.journal.release_all()
        if self.local is not None:
            await self.local.close()
        if self._session is not None:
            await self._session.end()
        await self.channel.close()

    async def _start_session(self) -> None:
        session = await Session.open(
            self.stub, self.client_name, self.providers, self._lost, self.call_timeout
        )
        self._session = session
        session.on_ejected = lambda ejected: self._provider_ejected(session, ejected)
        try:
            for disposed in await self.journal.replay(session.id, self.call_timeout):
                await self._dispose_on(session.id, disposed)
        except BaseException:
            await session.end()  # leave nothing half-replayed on the sidecar
            raise

    def _provider_ejected(self, session: Session, ejected: pb.CallbackEjected) -> None:
        record = self.journal.find(ejected.registration_id)
        if record is not None and session is self._session:
            self.reinstalls.ejected(record, session.id, ejected.message or ejected.reason)

    def listener_ejected(self, record: ListenerRegistration, why: str) -> None:
        """The sidecar ejected `record`'s listener and ended its stream: install it again."""
        if record in self.journal:
            self.reinstalls.ejected(record, self.session_id, why)

    def listener_lost(self, record: ListenerRegistration, why: str) -> None:
        """`record`'s stream ended while this client keeps it (the sidecar closed it): it
        is installed again on the same session, which the sidecar keeps (with the rest of
        its registrations); a lost session is made again, and replays it, on its own."""
        if record in self.journal and not self.closed:
            self.reinstalls.lost(record, self.session_id, why)

    async def _reinstall(self, record: Registration, session_id: str) -> None:
        """Make an ejected (or lost) `record` again, on the session it was ejected from:
        after a reconnect the replay made it already, and a disposed one is not made
        again."""
        if self.closed or record not in self.journal or self.session_id != session_id:
            return
        await record.release()  # an ejected listener's stream has ended
        try:
            await send(record, session_id, self.call_timeout)
        except SystemPromptError as error:  # a lost session replays it anyway
            # %r here and below: the sidecar's words, a log line each, their controls escaped
            _log.warning("could not register an ejected callback again: %r", str(error))
            return
        if self.closed:  # closed while it was made: close() did not see its stream
            await record.release()
        elif record not in self.journal:  # disposed while it was made: the disposer wins
            await self._dispose_on(session_id, record)

    def _lost(self, session: Session) -> None:
        if session is self._session:
            self._start_over(None)

    def restart(self) -> None:
        """The sidecar and this client may disagree on what is registered (a call went
        unanswered, a listener stream was dropped): end the session, open a new one
        and replay, so that the journal is the truth again."""
        self._start_over(self._session)

    def _start_over(self, ending: Session | None) -> None:
        if self.closed or self._reconnecting is not None:
            return
        self.connected.clear()
        self._reconnecting = asyncio.create_task(self._reconnect(ending))

    async def _reconnect(self, ending: Session | None) -> None:
        delay = _FIRST_BACKOFF_S
        try:
            if ending is not None:
                await ending.end()  # the sidecar disposes all of it, whatever it kept
            while not self.closed:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                try:
                    await self._start_session()
                except SystemPromptError as error:
                    _log.info("sidecar unavailable, retrying in %.2fs: %r", delay, str(error))
                    continue
                if self._session is None or self._session.ended:
                    _log.info("the session ended during its replay, retrying in %.2fs", delay)
                    continue  # its registrations went with it
                self.connected.set()
                _log.info(
                    "reconnected as a new session; %d registrations replayed", len(self.journal)
                )
                return
        finally:
            self._reconnecting = None

    # -- calls ------------------------------------------------------------------------

    async def call(
        self, rpc: Callable[..., Awaitable[T]], request: Message, timeout: float | None = None
    ) -> T:
        """Make a unary call for this session; gRPC failures become SystemPromptError."""
        await self.ready(timeout)
        try:  # in a traced caller, the call carries its span's context (W3C traceparent)
            return await rpc(request, timeout=timeout, metadata=outgoing())
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    async def ready(self, timeout: float | None = None) -> None:
        """Fail fast while reconnecting, or wait up to `timeout` when one is given."""
        self.check_open()
        if self.connected.is_set():
            return
        if timeout is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.connected.wait(), timeout)
            if self.connected.is_set():
                return
        raise SystemPromptError(
            "sidecar unavailable: the connection is down and being re-established",
            grpc.StatusCode.UNAVAILABLE,
            Reason.SIDECAR_UNAVAILABLE,
        )

    def check_open(self) -> None:
        if self.closed:
            raise SystemPromptError(
                "this client is closed: its session and registrations are gone",
                grpc.StatusCode.FAILED_PRECONDITION,
                Reason.SESSION_CLOSED,
            )

    # -- registrations ----------------------------------------------------------------

    async def register(self, record: Registration) -> None:
        """Make a registration and keep it for replay; nothing is kept if it fails."""
        await self.ready()
        try:
            await send(record, self.session_id, self.call_timeout)
        except BaseException as error:
            self.providers.remove(record.provider_key)
            if isinstance(error, NoAnswer):
                self.restart()  # it may be registered there: a new session drops it
            raise
        self.journal.keep(record)
        self.wrote(record.revision)

    async def dispose(self, record: Registration) -> None:
        """Dispose `record` (and, for a scope, everything made through it)."""
        for child in self.journal.made_through(record):
            self._forget(child)
            await child.release()
        self._forget(record)
        # A listener's stream's end disposes it; else, or if it did not end so, a Dispose.
        if self._holds(record) and await record.end(self.call_timeout):
            return
        await record.release()
        if self._holds(record):  # else the sidecar has nothing of it now, nor a replay later
            await self._dispose_on(self.session_id, record)

    def _holds(self, record: Registration) -> bool:
        """Whether the sidecar may hold `record` on the current session."""
        return not self.closed and self.connected.is_set() and bool(record.registration_id)

    async def _dispose_on(self, session_id: str, record: Registration) -> None:
        request = pb.DisposeRequest(session_id=session_id, registration_id=record.registration_id)
        try:
            reply = await self.stub.Dispose(request, timeout=self.call_timeout)
        except grpc.RpcError as rpc_error:
            error = answer_error(rpc_error, "Dispose", self.call_timeout)
            if isinstance(error, NoAnswer):
                self.restart()  # it may still be registered there: a new session drops it
            if error.code != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: gone already
                raise error from None
            return
        self.wrote(reply.revision)

    async def update(
        self, record: Registration, update: Update, timeout: float | None = None
    ) -> int:
        """Replace `record`'s value on the sidecar, then in the journal (for replay)."""
        await self.ready(timeout)
        update.request.session_id = self.session_id  # after the wait: the current session
        update.request.registration_id = record.registration_id
        reply: pb.UpdateResponse = await self.call(self.stub.Update, update.request)
        if record in self.journal:  # not disposed meanwhile
            update.apply()
        self.wrote(reply.revision)
        return reply.revision

    def wrote(self, revision: int) -> None:
        """This client changed the registry (its reply said `revision`, 0: not said): the
        local cache serves nothing older (read-your-writes)."""
        if self.local is not None:
            self.local.wrote(revision)

    async def invalidate(self, record: Registration) -> None:
        """Drop the sidecar's cached answers of `record`'s provider or listener. Done
        once the sidecar confirms; nothing to do while disconnected (the registration
        is made again on reconnect, which drops every cached answer)."""
        if self.closed or not self.connected.is_set() or record not in self.journal:
            return
        if isinstance(record, ListenerRegistration):
            if record.stream is not None:
                await record.stream.invalidate(self.call_timeout)
        elif record.provider_key is not None and self._session is not None:
            await self._session.invalidate([record.provider_key], self.call_timeout)

    def _forget(self, record: Registration) -> None:
        self.journal.forget(record)
        self.providers.remove(record.provider_key)
