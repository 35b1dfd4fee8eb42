"""The change-event stream as an async iterator that survives sidecar restarts.

When the stream breaks (the sidecar restarted, the network dropped, the
sidecar ended it), it subscribes again after the last revision it delivered.
The sidecar replays what was missed from its history; when it cannot (the
history moved on, or a restarted sidecar is a new incarnation), the stream
lists the registrations afresh and yields one `ChangesResynced` holding that
snapshot, then carries on with the changes after it. Revisions only grow
within an incarnation: a sidecar that breaks that raises SystemPromptError
(PROTOCOL_ERROR), so a watcher never acts on a wrong picture of the registry.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from ._convert import change_from_proto
from ._opening import confirmed
from ._snapshots import list_registrations
from .errors import SystemPromptError, error_from_rpc, protocol_error
from .types import ChangeEvent, ChangesMissed, ChangesResynced

_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0
# A stream that breaks with one of these is resumed; any other status ends it with an error.
_RESUMABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}

ChangeItem = ChangeEvent | ChangesMissed | ChangesResynced
# The watch features this client implements: a ChangeBatch holds several events.
WATCH_FEATURES = ["change-batches"]


class WatchCall(Protocol):
    """The client's side of a WatchChanges stream."""

    async def read(self) -> object: ...  # a WatchChangesResponse, or grpc.aio.EOF at the end

    async def code(self) -> grpc.StatusCode: ...

    def cancel(self) -> bool: ...


class ChangeStream:
    """`async for item in changes`: a ChangeEvent per change; ChangesMissed when this
    watcher fell behind its buffer; ChangesResynced after a restart or a break the
    sidecar's history could not bridge (rebuild your view from its snapshot).

    `last_revision` and `incarnation` are what `watch_changes(after_revision=...,
    incarnation=...)` takes to resume in another process.
    """

    def __init__(
        self,
        stub: pb_grpc.SystemPromptServiceStub,
        request: pb.WatchChangesRequest,
        timeout: float,
        on_break: Callable[[], None] | None = None,
        on_resume: Callable[[], None] | None = None,
    ) -> None:
        self._stub = stub
        self._on_break = on_break  # the stream broke: changes may pass unseen until...
        self._on_resume = on_resume  # ...it is subscribed again
        self._request = request
        self._timeout = timeout  # for each subscription's confirmation
        self._call: WatchCall | None = None
        self._pending: list[ChangesResynced] = []
        self._batched: deque[pb.WatchChangesResponse] = deque()  # a batch's events, one by one
        self._skip_until = 0  # events up to this revision are in a resync's snapshot
        self._closed = False
        self.revision = 0  # the revision when the subscription started
        self.incarnation = request.incarnation  # of the sidecar the revisions belong to
        self.last_revision = request.after_revision  # delivered, or covered by a gap or snapshot

    async def start(self) -> None:
        """Subscribe; subscribed when this returns (a refusal raises here)."""
        await self._subscribe()
        self.revision = self.revision or self.last_revision

    def __aiter__(self) -> ChangeStream:
        return self

    async def __anext__(self) -> ChangeItem:
        while True:
            if self._pending:
                return self._pending.pop(0)
            message = self._batched.popleft() if self._batched else await self._read()
            if message is None:
                if self._on_break is not None:
                    self._on_break()
                await self._resume()
                if self._on_resume is not None:
                    self._on_resume()
                continue
            kind = message.WhichOneof("kind")
            if kind == "event":
                if message.event.revision > self._skip_until:
                    return self._event(message.event)
            elif kind == "missed":
                return self._missed(message.missed)
            elif kind == "batch":
                self._unbatch(message.batch)
            elif kind == "subscribed":
                raise self._broken("a second WatchSubscribed on the change stream")
            # a kind this client does not know (a newer sidecar's) is skipped

    def _unbatch(self, batch: pb.ChangeBatch) -> None:
        """Queue a batch's events (then its gap) as if each had come in a message of its own."""
        self._batched.extend(pb.WatchChangesResponse(event=event) for event in batch.events)
        if batch.HasField("missed"):
            self._batched.append(pb.WatchChangesResponse(missed=batch.missed))

    async def close(self) -> None:
        """Stop watching."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    async def _read(self) -> pb.WatchChangesResponse | None:
        """The next message, or None when the stream broke and is to be resumed."""
        if self._closed or self._call is None:
            raise StopAsyncIteration
        try:
            message = await self._call.read()
        except grpc.RpcError as error:
            if self._closed:
                raise StopAsyncIteration from None
            if error.code() in _RESUMABLE:
                return None
            raise error_from_rpc(error) from None
        if self._closed:
            raise StopAsyncIteration
        if not isinstance(message, pb.WatchChangesResponse):  # grpc.aio.EOF
            return None  # the sidecar ended it (draining, restarting): resume
        return message

    async def _resume(self) -> None:
        """Subscribe again after the last revision delivered, with backoff until it works."""
        self._request.after_revision = self.last_revision
        self._request.incarnation = self.incarnation
        delay = _FIRST_BACKOFF_S
        while not self._closed:
            try:
                await self._subscribe()
                return
            except SystemPromptError as error:
                if error.code not in _RESUMABLE:
                    self._closed = True
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF_S)
        raise StopAsyncIteration

    async def _subscribe(self) -> None:
        call: WatchCall = self._stub.WatchChanges(self._request)
        first = await confirmed(
            call, None, pb.WatchChangesResponse, "subscribed", "watching changes", self._timeout
        )
        self._call = call
        subscribed = first.subscribed
        restarted = bool(self.incarnation) and subscribed.incarnation != self.incarnation
        self.incarnation = subscribed.incarnation
        if not self._request.HasField("after_revision"):
            self.last_revision = self.revision = subscribed.revision
        elif subscribed.resync:
            await self._resync(restarted)

    async def _resync(self, restarted: bool) -> None:
        """Take a snapshot: the events it already holds are skipped from here on."""
        request = pb.ListRegistrationsRequest(filter=self._request.filter)
        snapshot = await list_registrations(self._stub, request, self._timeout)
        self._skip_until = self.last_revision = snapshot.revision
        self.incarnation = snapshot.incarnation
        self._pending.append(ChangesResynced("restarted" if restarted else "behind", snapshot))

    def _event(self, message: pb.ChangeEvent) -> ChangeEvent:
        if message.revision <= self.last_revision:
            raise self._broken(f"change event {message.revision} after {self.last_revision}")
        self.last_revision = message.revision
        return change_from_proto(message)

    def _missed(self, message: pb.ChangesMissed) -> ChangesMissed:
        first, count, resync = (
            message.first_missed_revision,
            message.count,
            message.resync_revision,
        )
        if first <= self.last_revision or count < 1 or resync < first:
            raise self._broken(
                f"missed {count} changes from {first} to {resync} after {self.last_revision}"
            )
        self.last_revision = resync
        return ChangesMissed(first, count, resync)

    def _broken(self, what: str) -> SystemPromptError:
        """End the stream: a watcher must not act on events out of order."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()
        return protocol_error(what)
