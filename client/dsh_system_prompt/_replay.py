"""Replay: what the client does on reconnect.

Every registration this client owns is kept in a `Journal` as a typed record
of the request that makes it, in the order it was made. After a lost session
(the sidecar restarted, the network dropped) the connection opens a new
session and `Journal.replay` makes every record again on it, in that order:
a scope handle before what was registered through it, a listener on a new
stream. Assemblies after the restart then equal those before it. Disposers
hold records, not ids, so they keep working across restarts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import Reason

from ._listeners import Listener, ListenerStream
from .errors import NoAnswer, SystemPromptError, error_from_rpc


class OnSession(Protocol):
    """A request that names the session it is made on."""

    session_id: str


class Addressed(OnSession, Protocol):
    """A registration request: it names the session and the scope it registers in."""

    scope_id: str


class Revised(Protocol):
    """A reply that tells the registry's revision once the call was made."""

    @property
    def revision(self) -> int: ...


class Registered(Revised, Protocol):
    """A registration reply."""

    @property
    def registration_id(self) -> str: ...


Request = TypeVar("Request", bound=Addressed)
Reply = TypeVar("Reply", bound=Revised)


@dataclass(eq=False, kw_only=True)
class Registration(ABC):
    """One registration this client owns; compared by identity, as disposers hold it."""

    scope: Registration | None = None  # the scope handle it was made through
    provider_key: str | None = None  # its dynamic provider in this client
    registration_id: str = ""  # its id on the current session
    revision: int = 0  # the registry's revision once it was made (0: not told)

    @abstractmethod
    async def make(self, session_id: str, timeout: float) -> str:
        """Register it on the session `session_id` within `timeout`; returns its
        registration id there."""

    async def release(self) -> None:  # noqa: B027  (a hook: only a listener holds more)
        """Let go of what this client holds for it besides the record."""

    async def end(self, timeout: float) -> bool:
        """Dispose it on the sidecar if it has a way of its own (a listener's stream):
        True once the sidecar confirmed it within `timeout`, False when a Dispose is still
        to be sent (`release` lets go of the rest either way)."""
        return False

    def scope_id(self) -> str:
        return "" if self.scope is None else self.scope.registration_id

    async def _called(
        self,
        rpc: Callable[..., Awaitable[Reply]],
        request: OnSession,
        session_id: str,
        timeout: float,
    ) -> Reply:
        """`rpc`'s reply to `request` sent on the session `session_id`; its revision noted."""
        request.session_id = session_id
        reply = await rpc(request, timeout=timeout)
        self.revision = reply.revision
        return reply


@dataclass(eq=False, kw_only=True)
class Contribution(Registration, Generic[Request]):
    """A section, context, suppressor, tool provider or variable: one unary call."""

    request: Request
    rpc: Callable[..., Awaitable[Registered]]

    async def make(self, session_id: str, timeout: float) -> str:
        self.request.scope_id = self.scope_id()
        return (await self._called(self.rpc, self.request, session_id, timeout)).registration_id


@dataclass(eq=False, kw_only=True)
class ScopeHandle(Registration):
    """A handle on a scope key; what is registered through it names it as `scope`."""

    request: pb.OpenScopeRequest
    rpc: Callable[..., Awaitable[pb.OpenScopeResponse]]

    async def make(self, session_id: str, timeout: float) -> str:
        return (await self._called(self.rpc, self.request, session_id, timeout)).scope_id


@dataclass(eq=False, kw_only=True)
class ListenerRegistration(Registration):
    """A waterfall listener: installed for as long as its own stream stays open."""

    start: pb.ListenStart
    listener: Listener
    stub: pb_grpc.SystemPromptServiceStub
    # the sidecar ended the stream while the session lives: given the record and why
    on_lost: Callable[[ListenerRegistration, str], None]
    # the sidecar ejected it (it did not answer in time): given the record and why
    on_ejected: Callable[[ListenerRegistration, str], None] = lambda *_: None
    stream: ListenerStream | None = None

    async def make(self, session_id: str, timeout: float) -> str:
        self.start.session_id = session_id
        self.start.scope_id = self.scope_id()
        stream = ListenerStream(
            self.stub,
            self.listener,
            lambda why: self.on_lost(self, why),
            lambda why: self.on_ejected(self, why),
        )
        registration_id = await stream.start(self.start, timeout)
        self.stream = stream
        return registration_id

    async def release(self) -> None:
        if self.stream is not None:
            await self.stream.close()
            self.stream = None

    async def end(self, timeout: float) -> bool:
        """Its stream's half-close disposes it: no Dispose is sent after it."""
        stream, self.stream = self.stream, None
        return stream is not None and await stream.end(timeout)


async def send(record: Registration, session_id: str, timeout: float) -> None:
    """Make `record` on the session `session_id`; gRPC failures become SystemPromptError,
    and no answer within `timeout` NoAnswer."""
    try:
        record.registration_id = await record.make(session_id, timeout)
    except grpc.RpcError as error:
        raise answer_error(error, type(record).__name__, timeout) from None


def answer_error(error: grpc.RpcError, what: str, timeout: float) -> SystemPromptError:
    """The error for a call the sidecar answers at once: our own deadline is NoAnswer."""
    failure = error_from_rpc(error)
    if failure.code == grpc.StatusCode.DEADLINE_EXCEEDED and failure.reason == Reason.UNKNOWN:
        return NoAnswer(what, timeout)
    return failure


class Journal:
    """The registrations this client owns, in the order they were made."""

    def __init__(self) -> None:
        self._records: dict[Registration, None] = {}  # a dict keeps insertion order

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, record: Registration) -> bool:
        return record in self._records

    def keep(self, record: Registration) -> None:
        self._records[record] = None

    def forget(self, record: Registration) -> None:
        self._records.pop(record, None)

    def find(self, registration_id: str) -> Registration | None:
        """The record made as `registration_id` on the current session, if any."""
        return next((r for r in self._records if r.registration_id == registration_id), None)

    def made_through(self, scope: Registration) -> list[Registration]:
        return [record for record in self._records if record.scope is scope]

    async def release_all(self) -> None:
        for record in list(self._records):
            await record.release()

    async def replay(self, session_id: str, timeout: float) -> list[Registration]:
        """Make every record again on the new session `session_id`, in the original order.

        Returns the records made here and disposed while the replay went on: the
        sidecar still holds them, and the caller disposes them there (the disposer wins).
        """
        await self.release_all()  # a lost session's listener streams went with it
        made: list[Registration] = []
        for record in list(self._records):
            if record in self._records:  # not disposed meanwhile
                await send(record, session_id, timeout)
                made.append(record)
        return [record for record in made if record not in self._records]
