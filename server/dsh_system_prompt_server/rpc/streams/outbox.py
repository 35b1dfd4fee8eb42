"""What the sidecar sends on one peer's stream: written in order, bounded in bytes and time.

A peer that stops reading makes gRPC's writes wait forever once the stream's
flow-control window is full. Nothing the sidecar does for anyone else may wait
on such a write: callers only queue messages here, one pump writes them, and
a peer that leaves too much unread or takes too long over one message is
marked stalled, so its stream's owner can close it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from dsh_system_prompt_core import Reason

from ...registry import ServiceError, Status


class Message(Protocol):
    """What an outbox holds: a protobuf message (it knows its size)."""

    def ByteSize(self) -> int: ...  # protobuf's name


M = TypeVar("M", bound=Message)


@dataclass(frozen=True)
class OutboxLimits:
    """How much a peer may leave unread, and how long one write may take."""

    max_bytes: int = 8 * 1024 * 1024
    write_timeout_s: float = 5.0


class Outbox(Generic[M]):
    """A stream's outgoing messages (or their encodings, which gRPC writes as they are);
    `run()` writes queued ones until the stream ends or stalls."""

    def __init__(
        self, write: Callable[[M | bytes], Awaitable[None]], limits: OutboxLimits, peer: str
    ) -> None:
        self._write = write
        self._limits = limits
        self._peer = peer
        self._queue: deque[tuple[M | bytes, int]] = deque()
        self._queued_bytes = 0
        self._ready = asyncio.Event()
        self._empty = asyncio.Event()  # nothing queued, nothing being written
        self._empty.set()
        self.stalled = asyncio.Event()
        self.stall_reason = ""

    def send(self, message: M | bytes) -> bool:
        """Queue `message`; False (and nothing queued) once the peer has stalled."""
        if self.stalled.is_set():
            return False
        size = len(message) if isinstance(message, bytes) else message.ByteSize()
        if self._queue and self._queued_bytes + size > self._limits.max_bytes:
            self._stall(f"it left more than {self._limits.max_bytes} bytes unread")
            return False
        self._queue.append((message, size))
        self._queued_bytes += size
        self._empty.clear()
        self._ready.set()
        return True

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

    async def run(self) -> None:
        """Write queued messages in order; return as soon as the peer stalls."""
        pump = asyncio.ensure_future(self._pump())
        try:
            await self.stalled.wait()
        finally:
            pump.cancel()

    async def _pump(self) -> None:
        while not self.stalled.is_set():
            if not self._queue:
                self._empty.set()
                self._ready.clear()
                await self._ready.wait()
                continue
            message, size = self._queue.popleft()
            self._queued_bytes -= size
            await self._written(message)

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
        self._queue.clear()  # nobody will read them: let them go now
        self._queued_bytes = 0
        self.stalled.set()
        self._empty.set()  # nothing more will be written
        self._ready.set()  # wake the pump so that it returns
