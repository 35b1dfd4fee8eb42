"""What the sidecar sends on one peer's stream: written in order, bounded in bytes and time.

A peer that stops reading makes gRPC's writes wait forever once the stream's
flow-control window is full. Nothing the sidecar does for anyone else may wait
on such a write: callers hand messages over here and never wait on them (the
outbox writes one at a time, in order, the first at once), and a peer that
leaves too much unread or takes too long over one message is marked stalled,
so its stream's owner can close it.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from dsh_system_prompt_core import Reason, step_through

from ...registry import RegistrySettings, ServiceError, Status
from ..settings import ServerLimits
from .flag import Flag


class Message(Protocol):
    """What an outbox holds: a protobuf message (it knows its size)."""

    def ByteSize(self) -> int: ...  # protobuf's name


M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class OutboxLimits:
    """How much a peer may leave unread, and how long one write may take."""

    max_bytes: int = ServerLimits.max_outbox_bytes
    write_timeout_s: float = RegistrySettings.provider_timeout_s


class Outbox(Generic[M]):
    """A stream's outgoing messages (or their encodings, which gRPC writes as they are).

    `send()` starts a message's write at once when nothing is being written, and queues it
    otherwise; each write's end starts the next queued one. No task stands between a
    sender and the stream, and none awaits a write (`step_through`): a sender cancelled
    (an assembly's deadline) cannot cancel a write half-sent. A timer, not a
    cancellation, bounds how long one write may take.
    """

    def __init__(
        self, write: Callable[[M | bytes], Awaitable[None]], limits: OutboxLimits, peer: str
    ) -> None:
        self._write = write
        self._limits = limits
        self._peer = peer
        # made when a message first waits (an idle stream's writes start at once): an empty
        # deque is 600 bytes, and most streams never queue
        self._queue: deque[tuple[M | bytes, int]] | None = None
        self._queued_bytes = 0  # of the queue: the message being written is not counted
        self._writing = 0  # the write going on (they are numbered), 0 when none is
        self._writes = 0
        self._starting = False  # _write_next is on it: a write done at once returns there
        self._timer: asyncio.TimerHandle | None = None
        self._empty = Flag(is_set=True)  # nothing queued, nothing being written
        self.stalled = Flag()
        self.stall_reason = ""
        self._broken = False  # a write failed: the stream is gone, nothing more is written

    def send(self, message: M | bytes) -> bool:
        """Write `message` now if nothing is being written, else queue it; False (and
        nothing queued) once the peer has stalled or its stream has failed."""
        if self.stalled.is_set() or self._broken:
            return False
        if not self._writing and not self._queue:  # idle: its write starts now, unqueued
            self._start(message)
            return not (self.stalled.is_set() or self._broken)
        size = len(message) if isinstance(message, bytes) else message.ByteSize()
        if self._queue and self._queued_bytes + size > self._limits.max_bytes:
            self._stall(f"it left more than {self._limits.max_bytes} bytes unread")
            return False
        if self._queue is None:
            self._queue = deque()
        self._queue.append((message, size))
        self._queued_bytes += size
        self._empty.clear()
        if not self._writing:
            self._write_next()
        return not (self.stalled.is_set() or self._broken)

    async def write(self, message: M | bytes) -> bool:
        """Write `message` now and wait for it, for a stream that writes one message at a
        time (a watch); False once the peer has stalled."""
        if self.stalled.is_set():
            return False
        await self._written(message)
        return not self.stalled.is_set()

    async def drained(self) -> None:
        """Wait until every queued message is written, or the peer stalled (a write that
        does not complete in `write_timeout_s` stalls it, so this wait is bounded)."""
        await self._empty.wait()

    def _write_next(self) -> None:
        """Nothing is being written: start the queued messages in turn, until one waits."""
        if self._starting:
            return
        self._starting = True
        try:
            while not self._writing and self._queue and not self._broken:
                message, size = self._queue.popleft()
                self._queued_bytes -= size
                self._start(message)
        finally:
            self._starting = False
        if not self._writing:
            self._empty.set()

    def _start(self, message: M | bytes) -> None:
        """Start writing `message` (nothing else is being written)."""
        self._empty.clear()
        self._writes += 1
        self._writing = write = self._writes
        # Timed from the loop's next turn, as a pump's write was: a sender's own
        # deadline for the answer, armed right after this, then comes first.
        asyncio.get_running_loop().call_soon(self._arm, write)
        step_through(self._write(message), functools.partial(self._written_one, write))

    def _written_one(self, write: int, error: BaseException | None) -> None:
        if write != self._writing:
            return
        self._writing = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if error is not None:  # the stream ended under the write: nothing more is written
            self._broken = True
            self._drop()
        self._write_next()

    def _arm(self, write: int) -> None:
        if write == self._writing:
            timeout = self._limits.write_timeout_s
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(timeout, self._timed_out, timeout)

    def _timed_out(self, timeout: float) -> None:
        # The write itself is left to finish or fail with its stream: never cancelled.
        self._timer = None
        self._stall(f"it did not read a message within {timeout:g}s")

    async def _written(self, message: M | bytes) -> None:
        """Write one message, bounded in time: a peer that does not take it has stalled."""
        timeout = self._limits.write_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._write(message)
        except TimeoutError:
            self._stall(f"it did not read a message within {timeout:g}s")

    def stall_error(self) -> ServiceError:
        """The status its stream ends with once stalled."""
        return ServiceError(
            Status.RESOURCE_EXHAUSTED,
            Reason.STREAM_STALLED,
            f"{self._peer} was closed: {self.stall_reason}",
        )

    def _stall(self, reason: str) -> None:
        if self.stalled.is_set():
            return
        self.stall_reason = reason
        self.stalled.set()
        self._drop()

    def _drop(self) -> None:
        """Nothing more will be written: let the queued messages go now."""
        self._queue = None
        self._queued_bytes = 0
        self._empty.set()
