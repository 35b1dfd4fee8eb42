"""The change-event stream as an async iterator."""

from __future__ import annotations

from typing import Protocol

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import change_from_proto
from .errors import SystemPromptError, error_from_rpc, protocol_error, stream_ended
from .types import ChangeEvent, ChangesMissed


class WatchCall(Protocol):
    """The client's side of a WatchChanges stream."""

    async def read(self) -> object: ...  # a WatchChangesResponse, or grpc.aio.EOF at the end

    async def code(self) -> grpc.StatusCode: ...

    def cancel(self) -> bool: ...


class ChangeStream:
    """`async for event in changes`: ChangeEvent, or ChangesMissed after a gap.

    Revisions only grow: a stream that breaks that (or ends while this client
    still watches) raises SystemPromptError, so a watcher never acts on a
    wrong picture of the registry.
    """

    def __init__(self, call: WatchCall, revision: int) -> None:
        self._call = call
        self.revision = revision  # the revision when the subscription started
        self._last = revision  # the last revision delivered (or skipped by a gap)
        self._closed = False

    def __aiter__(self) -> ChangeStream:
        return self

    async def __anext__(self) -> ChangeEvent | ChangesMissed:
        while True:
            message = await self._read()
            kind = message.WhichOneof("kind")
            if kind == "event":
                return self._event(message.event)
            if kind == "missed":
                return self._missed(message.missed)
            if kind == "subscribed":
                raise self._broken("a second WatchSubscribed on the change stream")
            # a kind this client does not know (a newer sidecar's) is skipped

    async def close(self) -> None:
        """Stop watching."""
        self._closed = True
        self._call.cancel()

    async def _read(self) -> pb.WatchChangesResponse:
        try:
            message = await self._call.read()
        except grpc.RpcError as error:
            if self._closed or error.code() == grpc.StatusCode.CANCELLED:  # by this client
                raise StopAsyncIteration from None
            raise error_from_rpc(error) from None
        if self._closed:
            raise StopAsyncIteration
        if not isinstance(message, pb.WatchChangesResponse):  # the end: grpc.aio.EOF
            # The sidecar never ends a subscription on its own: the watcher must resubscribe.
            self._closed = True
            raise stream_ended("it ended the change stream", await self._call.code())
        return message

    def _event(self, message: pb.ChangeEvent) -> ChangeEvent:
        if message.revision <= self._last:
            raise self._broken(f"change event {message.revision} after {self._last}")
        self._last = message.revision
        return change_from_proto(message)

    def _missed(self, message: pb.ChangesMissed) -> ChangesMissed:
        first, count, resync = (
            message.first_missed_revision, message.count, message.resync_revision,
        )  # fmt: skip
        if first <= self._last or count < 1 or resync < first:
            raise self._broken(
                f"missed {count} changes from {first} to {resync} after {self._last}"
            )
        self._last = resync
        return ChangesMissed(first, count, resync)

    def _broken(self, what: str) -> SystemPromptError:
        """End the stream: a watcher must not act on events out of order."""
        self._closed = True
        self._call.cancel()
        return protocol_error(what)
