"""Bytes being written to a kind of stream, bounded per client and all clients together.

A WatchPrompt message is the whole prompt: each watcher of a 3.5 MiB scope holds
its own copy until its peer takes it (the shared encoding joined with its own
changes, then gRPC's copy), so 256 watchers that read once and stop held 1.8 GiB
for their write timeout. A writer reserves its message's size before it builds
it and gives it back once it is written: past the bound the others wait (and then
send the latest prompt), so what the watchers hold is the bound, not their number.

Like Envoy's `per_connection_buffer_limit_bytes` (a buffer limit per connection,
whose overrun holds back that connection's data alone), each client has a share of
the bound: a client's watchers that stop reading hold its share for their write
timeout, and its other watchers wait behind it, while every other client's
messages still fit in the rest. A message larger than a share goes alone among
its client's and counts as one share against the bound, so that one big prompt
stalled waits for nothing but its own client's (it waited for every client's
writes to end, and then held everyone up for the write timeout).

Waiters are served in the order they came (strict FIFO with head-of-line blocking,
as HTTP/2 flow control and Envoy's buffer limits serve a stream's data): a release
gives what it freed to the earliest waiter whose client's share lets it go, and
to the next while they fit, and stops at the first that does not fit the bound, so
a large message is not overtaken forever by small ones that came after it. A
waiter held back by its own client's share holds up no other client's (the share
isolates the clients); its client's later waiters stay behind it, so its client's
small messages do not starve it either. A release wakes only the waiters it
serves, handing each its bytes already reserved: no waiter looks in vain.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator

SHARES = 4  # clients whose stalled watchers together fill the bound


@dataclasses.dataclass(eq=False)
class _Waiter:
    """A reservation waiting to fit: `granted` once a release reserved its bytes for it."""

    order: int  # its place in the arrival order
    size: int
    client: str | None
    future: asyncio.Future[None]
    granted: bool = False
    charged: int = 0  # what it counts against the bound (as the share was when it went)


class InFlight:
    """At most `max_bytes` reserved at once, and at most a `SHARES`th of it by one client
    (one larger reservation alone), served in arrival order; a client of None (one the
    sidecar cannot tell apart) has no share of its own, only the bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0  # charged against max_bytes now (a reservation past a share: a share)
        self.peak = 0  # the most ever charged at once
        self._held: Counter[str] = Counter()  # reserved by each client now
        # each client's waiters in arrival order: a release looks at each client's first
        self._queues: dict[str | None, deque[_Waiter]] = {}
        self._arrivals = itertools.count()

    @property
    def share(self) -> int:
        """What one client's reservations may take together."""
        return max(1, self.max_bytes // SHARES)

    def resize(self, max_bytes: int) -> None:
        """Take a reloaded bound: a raised one lets the reservations that now fit go at once,
        a lowered one holds the next back until what is held fits."""
        self.max_bytes = max_bytes
        self._grant()

    def waiting(self) -> int:
        """Reservations waiting to fit now."""
        return sum(len(queue) for queue in self._queues.values())

    @contextlib.asynccontextmanager
    async def reserved(self, size: int, client: str | None = None) -> AsyncIterator[None]:
        """Hold `size` bytes for `client` for the block, once they fit and every earlier
        waiter that fits before it went."""
        waiter = _Waiter(
            next(self._arrivals), size, client, asyncio.get_running_loop().create_future()
        )
        if not self._queues and self._share_lets(waiter) and self._bound_fits(waiter):
            self._take(waiter)  # nobody waiting to go first
        else:
            self._queues.setdefault(client, deque()).append(waiter)
            self._grant()
        if not waiter.granted:
            try:
                await waiter.future
            except BaseException:
                if waiter.granted:  # cancelled after a release reserved its bytes
                    self._release(waiter)
                else:  # gone from the queue: those it held up may fit now
                    self._dequeue(waiter)
                    self._grant()
                raise
        try:
            yield
        finally:
            self._release(waiter)

    def _share_lets(self, waiter: _Waiter) -> bool:
        """Its client's share lets it go (a larger reservation: alone among its client's)."""
        held = self._held[waiter.client] if waiter.client is not None else 0
        return not held or held + waiter.size <= self.share

    def _bound_fits(self, waiter: _Waiter) -> bool:
        return not self.bytes or self.bytes + min(waiter.size, self.share) <= self.max_bytes

    def _grant(self) -> None:
        """Serve the waiters in arrival order while they fit: the earliest whose share lets
        it go takes its bytes, then the next; the first that does not fit the bound stops
        the rest (head-of-line), so no later one overtakes it."""
        while True:
            heads = [queue[0] for queue in self._queues.values()]
            eligible = [head for head in heads if head.future.cancelled() or self._share_lets(head)]
            if not eligible:
                return
            head = min(eligible, key=lambda waiter: waiter.order)
            if head.future.cancelled():  # it leaves the queue itself once it runs
                self._dequeue(head)
                continue
            if not self._bound_fits(head):
                return
            self._dequeue(head)
            self._take(head)
            head.future.set_result(None)

    def _dequeue(self, waiter: _Waiter) -> None:
        queue = self._queues.get(waiter.client)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._queues[waiter.client]

    def _take(self, waiter: _Waiter) -> None:
        waiter.granted = True
        waiter.charged = min(waiter.size, self.share)
        self.bytes += waiter.charged
        self.peak = max(self.peak, self.bytes)
        if waiter.client is not None:
            self._held[waiter.client] += waiter.size

    def _release(self, waiter: _Waiter) -> None:
        self.bytes -= waiter.charged
        if waiter.client is not None:
            self._held[waiter.client] -= waiter.size
            if not self._held[waiter.client]:
                del self._held[waiter.client]
        self._grant()
