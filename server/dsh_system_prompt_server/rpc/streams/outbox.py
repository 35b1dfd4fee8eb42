"""What the sidecar sends on one peer's stream: written in order, bounded in bytes and time.

A peer that stops reading makes gRPC's writes wait forever once the stream's
flow-control window is full. Nothing the sidecar does for anyone else may wait
on such a write: callers hand messages over here and never wait on them (the
outbox writes one at a time, in order, the first at once), and a peer that takes
too long over one message is marked stalled, so its stream's owner can close it.

What is queued is bounded by flow control, not by closing the stream: as HTTP/2
does with a full window (the sender waits for the reader's WINDOW_UPDATE, the
stream is not reset), an invocation or provide request that would take the queue
past `max_bytes` waits (`put`, in arrival order) until the peer's reads make room,
within its caller's own time, and only a peer that does not take one message
within `write_timeout_s` is closed. A burst of other clients' assemblies on a
reading peer therefore slows them, never closes it (150 assemblies' 36 MB of
invocations on one global listener closed it, and the listener was silently
missing from the rest). The few control messages (cancels, confirmations, an
ejection) never wait: they go past the bound, up to as much again.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from dsh_system_prompt_core import Reason, step_through

from ...guard import Payer, payer, paying_turn
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
        # each with who pays for its write: the client whose call queued it (guard/paying.py)
        self._queue: deque[tuple[M | bytes, int, Payer | None]] | None = None
        self._queued_bytes = 0  # of the queue: the message being written is not counted
        self._writing = 0  # the write going on (they are numbered), 0 when none is
        self._writes = 0
        self._starting = False  # _write_next is on it: a write done at once returns there
        self._timer: asyncio.TimerHandle | None = None
        self._empty = Flag(is_set=True)  # nothing queued, nothing being written
        self.stalled = Flag()
        self.stall_reason = ""
        self._broken = False  # a write failed: the stream is gone, nothing more is written
        # senders waiting for room (`put`), in arrival order; made when one first waits
        self._waiters: deque[asyncio.Future[bool]] | None = None
        self._granted = False  # a waiter was let go and has not sent yet

    def send(self, message: M | bytes) -> bool:
        """Write `message` now if nothing is being written, else queue it (a control
        message: it never waits, up to twice the bound); False (and nothing queued) once
        the peer has stalled or its stream has failed."""
        return self._send(message, 2 * self._limits.max_bytes)

    def _send(self, message: M | bytes, bound: int | None) -> bool:
        if self.stalled.is_set() or self._broken:
            return False
        if not self._writing and not self._queue:  # idle: its write starts now, unqueued
            self._start(message)
            return not (self.stalled.is_set() or self._broken)
        size = _size(message)
        if bound is not None and self._queue and self._queued_bytes + size > bound:
            self._stall(f"it left more than {bound} bytes unread")
            return False
        self._queued(message, size, payer())
        return not (self.stalled.is_set() or self._broken)

    async def put(self, build: Callable[[], M | bytes], timeout: float | None) -> bool:
        """Send the message `build()` makes once the queue is below its bound and every
        earlier such message went (at once when it is and none waits): the peer's reads
        make room. It is built only then, so that messages go in the order they were built
        (part slots encode each invocation against the one before). False (nothing built)
        once the peer has stalled or its stream has failed; TimeoutError when no room came
        within `timeout` (nothing built either). Before any of it, the call sending it waits
        for its client's turn (guard/paying.py): one over its share of a busy loop does not
        build and write the messages of the calls it already has in flight ahead of others'."""
        await paying_turn()
        if self.stalled.is_set() or self._broken:
            return False
        if not self._waiters and not self._granted and self._has_room():
            return self._send(build(), None)
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = deque()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                admitted = await asyncio.shield(waiter)
        except TimeoutError:
            if not waiter.done():
                waiter.cancel()  # left where it is: the next admission passes over it
                raise
            admitted = waiter.result()  # admitted (or the peer gone) as the time ran out
        except asyncio.CancelledError:
            if waiter.done() and waiter.result():
                self._next_please()  # admitted, but its caller gave up: the next one's turn
            waiter.cancel()
            raise
        if not admitted:
            return False
        try:
            return self._send(build(), None)
        finally:
            self._next_please()

    def waiting(self) -> int:
        """Messages waiting for room now."""
        return sum(not waiter.done() for waiter in self._waiters or ())

    def _has_room(self) -> bool:
        # Below the bound, one more message of any size goes (a watermark, as in Envoy's
        # buffers): what is queued stays under the bound plus one message.
        return self._queued_bytes < self._limits.max_bytes

    def _next_please(self) -> None:
        self._granted = False
        self._admit()

    def _admit(self) -> None:
        """Let the earliest waiting message go if the queue has room: one at a time, each
        queued before the next is looked at (head-of-line, in arrival order)."""
        waiters = self._waiters
        while waiters and not self._granted and self._has_room():
            waiter = waiters.popleft()
            if waiter.done():  # its caller gave up
                continue
            self._granted = True
            waiter.set_result(True)

    def _queued(self, message: M | bytes, size: int, paying: Payer | None) -> None:
        if self._queue is None:
            self._queue = deque()
        self._queue.append((message, size, paying))
        self._queued_bytes += size
        self._empty.clear()
        if not self._writing:
            self._write_next()

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

    def _write_next(self, unmetered: bool = False) -> None:
        """Nothing is being written: start the queued messages in turn, until one waits.
        `unmetered`: run by a write's end, in no call's step, so a write started here costs
        the client whose call queued it its time (gRPC copies and sends it at its start)."""
        if self._starting:
            return
        self._starting = True
        try:
            while not self._broken:
                self._admit()  # what the last write made room for
                if self._writing or not self._queue:
                    break
                message, size, paying = self._queue.popleft()
                self._queued_bytes -= size
                if unmetered and paying is not None:
                    started = time.perf_counter()
                    self._start(message)
                    paying.charge(time.perf_counter() - started)
                else:
                    self._start(message)
        finally:
            self._starting = False
        if not self._writing and not self._queue:
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
        self._write_next(unmetered=True)

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
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(False)


def _size(message: M | bytes) -> int:
    return len(message) if isinstance(message, bytes) else message.ByteSize()
