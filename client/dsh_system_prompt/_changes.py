"""The change-event stream as an async iterator."""

from __future__ import annotations

from typing import Protocol

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import change_from_proto
from .errors import error_from_rpc
from .types import ChangeEvent, ChangesMissed


class WatchCall(Protocol):
    """The client's side of a WatchChanges stream."""

    async def read(self) -> object: ...  # a WatchChangesResponse, or grpc.aio.EOF at the end

    async def code(self) -> grpc.StatusCode: ...

    def cancel(self) -> bool: ...


class ChangeStream:
    """`async for event in changes`: ChangeEvent, or ChangesMissed after a gap."""

    def __init__(self, call: WatchCall, revision: int) -> None:
        self._call = call
        self.revision = revision  # the revision when the subscription started

    def __aiter__(self) -> ChangeStream:
        return self

    async def __anext__(self) -> ChangeEvent | ChangesMissed:
        try:
            message = await self._call.read()
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED:
                raise StopAsyncIteration from None
            raise error_from_rpc(error) from None
        if not isinstance(message, pb.WatchChangesResponse):  # the end: grpc.aio.EOF
            raise StopAsyncIteration
        if message.HasField("missed"):
            missed = message.missed
            return ChangesMissed(missed.first_missed_revision, missed.count, missed.resync_revision)
        return change_from_proto(message.event)

    async def close(self) -> None:
        """Stop watching."""
        self._call.cancel()
