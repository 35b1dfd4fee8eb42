"""Live prompts: `client.watch_prompt(scope)` as an async iterator of PromptChange."""

from __future__ import annotations

from typing import Protocol

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import assembly_from_proto, change_from_proto, report_from_proto
from .errors import error_from_rpc
from .types import PromptChange


class PromptCall(Protocol):
    """The client's side of a WatchPrompt stream."""

    async def read(self) -> object: ...  # a WatchPromptResponse, or grpc.aio.EOF at the end

    def cancel(self) -> bool: ...


class PromptStream:
    """`async for change in prompts`: the prompt now, then after each burst of changes.

    It ends (StopAsyncIteration) when closed; a broken stream (a restart)
    raises SystemPromptError: watch again to continue.
    """

    def __init__(self, call: PromptCall) -> None:
        self._call = call
        self._closed = False

    def __aiter__(self) -> PromptStream:
        return self

    async def __anext__(self) -> PromptChange:
        try:
            message = await self._call.read()
        except grpc.RpcError as error:
            if self._closed:
                raise StopAsyncIteration from None
            raise error_from_rpc(error) from None
        if self._closed or not isinstance(message, pb.WatchPromptResponse):
            raise StopAsyncIteration
        return prompt_change_from_proto(message)

    async def close(self) -> None:
        """Stop watching."""
        self._closed = True
        self._call.cancel()


def prompt_change_from_proto(message: pb.WatchPromptResponse) -> PromptChange:
    rendered = message.rendered if message.HasField("rendered") else None
    return PromptChange(
        revision=message.revision,
        incarnation=message.incarnation,
        assembly=assembly_from_proto(message.assembly) if message.HasField("assembly") else None,
        prompt=None if rendered is None else rendered.prompt,
        context_snapshot=None if rendered is None else rendered.context_snapshot,
        report=report_from_proto(message.report) if message.HasField("report") else None,
        changes=[change_from_proto(change) for change in message.changes],
        changes_omitted=message.changes_omitted,
        error=message.error,
    )
