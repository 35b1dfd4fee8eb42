"""A callback stream's read loop on this client's side: dispatch what comes, release at the end.

The sidecar asks on a session stream for provider values and on a listener stream for
listener runs. Either way this client answers each request that must wait in a task of
its own (one answered at once is written from the reader), one write at a time on the
stream, the first started at once and none awaited by its sender; a cancel names the
request to give up; and when the stream ends the answers still running are cancelled
(nobody reads them), waiting invalidations are released, and the owner hears of it.
Written once for both streams.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol

import grpc
from dsh_system_prompt_core import step_through
from google.protobuf.message import Message

from ._callback_cache import Invalidations

Handler = Callable[[Any], None]
"""Takes the message's one field set, e.g. a ProvideRequest."""


class _Call(Protocol):
    async def write(self, request: Any) -> None: ...

    async def read(self) -> object: ...  # a response, or grpc.aio.EOF at the end

    async def done_writing(self) -> None: ...


class Dispatch:
    """One callback stream's reader, its running answers by id, and its writes."""

    def __init__(
        self, response: type[Message], handlers: Mapping[str, Handler], call: _Call | None = None
    ) -> None:
        self.call = call  # the stream, once opened
        self._response = response
        self.invalidations = Invalidations()
        # A kind without a handler (a second confirmation, a newer sidecar's) is ignored.
        self._handlers: dict[str, Handler] = {"invalidated": self._invalidated, **handlers}
        # Written in order, one at a time; a write's future hears its end, if anyone asked.
        # None: the half-close, after the writes before it.
        self._writes: deque[tuple[Message | None, asyncio.Future[None] | None]] = deque()
        self._writing = False
        self._starting = False  # _write_next is on it: a write done at once returns there
        self._running: dict[int, asyncio.Task[None]] = {}
        self.end_reason = ""  # the status message the stream ended with, if it failed

    async def read(self, ended: Callable[[], None]) -> None:
        """Dispatch each message to its kind's handler until the stream ends; then release
        what it held and call `ended`."""
        assert self.call is not None, "read() before the stream is opened"
        try:
            while isinstance(message := await self.call.read(), self._response):
                kind = message.WhichOneof("kind")
                handler = self._handlers.get(kind or "")
                if handler is not None:
                    handler(getattr(message, kind or ""))
        except grpc.RpcError as error:
            details = getattr(error, "details", None)  # an aio error's: the status message
            self.end_reason = str(details() if callable(details) else "") or str(error)
        finally:
            self.cancel_all()  # their answers have nowhere to go now
            self.invalidations.release()
            ended()

    def start(self, key: int, answer: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Answer request `key` in a task of its own; a repeated key is being answered."""
        if key in self._running:
            return
        task = asyncio.create_task(answer())
        self._running[key] = task
        task.add_done_callback(lambda _: self._running.pop(key, None))

    def answering(self, key: int) -> bool:
        """Whether request `key` is being answered now (a repeat of it is not answered)."""
        return key in self._running

    def cancel(self, key: int) -> None:
        """The sidecar gave request `key` up."""
        task = self._running.get(key)
        if task is not None:
            task.cancel()

    def runs(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether `task` answers one of this stream's requests."""
        return task is not None and task in self._running.values()

    def running(self) -> int:
        """How many requests are being answered now."""
        return len(self._running)

    def cancel_all(self) -> None:
        for task in list(self._running.values()):
            task.cancel()

    async def write(self, request: Message) -> None:
        """Write `request` after those before it, and wait until it is written; raises
        when the stream is over (or not open yet: InvalidStateError). Cancelling the wait
        does not cancel the write (grpc.aio would cancel the whole call)."""
        if self.call is None:
            raise asyncio.InvalidStateError("the stream is not open")
        written = asyncio.get_running_loop().create_future()
        self._write_in_turn(request, written)
        await written

    async def done_writing(self) -> None:
        """Half-close the stream once what was written before is written, and wait for
        it; raises as `write` does."""
        if self.call is None:
            raise asyncio.InvalidStateError("the stream is not open")
        written = asyncio.get_running_loop().create_future()
        self._write_in_turn(None, written)
        await written

    def send(self, request: Message) -> None:
        """Write an answer after those before it, without waiting for it; a stream that
        is over has failed its request already."""
        if self.call is not None:
            self._write_in_turn(request, None)

    def _write_in_turn(self, request: Message | None, written: asyncio.Future[None] | None) -> None:
        self._writes.append((request, written))
        if not self._writing:
            self._write_next()

    def _write_next(self) -> None:
        """Nothing is being written: start the queued writes in turn, until one waits."""
        if self._starting or self.call is None:
            return
        self._starting = True
        try:
            while not self._writing and self._writes:
                request, written = self._writes.popleft()
                self._writing = True
                writing = self.call.done_writing() if request is None else self.call.write(request)
                step_through(writing, functools.partial(self._written, written))
        finally:
            self._starting = False

    def _written(self, written: asyncio.Future[None] | None, error: BaseException | None) -> None:
        self._writing = False
        if written is not None and not written.done():
            if error is None:
                written.set_result(None)
            else:
                written.set_exception(error)
        self._write_next()

    def _invalidated(self, done: Any) -> None:
        self.invalidations.confirmed(done.invalidate_id)
