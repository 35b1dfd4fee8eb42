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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

SHARES = 4  # clients whose stalled watchers together fill the bound


class InFlight:
    """At most `max_bytes` reserved at once, and at most a `SHARES`th of it by one client
    (one larger reservation alone); a client of None (one the sidecar cannot tell apart)
    has no share of its own, only the bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0  # charged against max_bytes now (a reservation past a share: a share)
        self.peak = 0  # the most ever charged at once
        self._held: Counter[str] = Counter()  # reserved by each client now
        self._waiters: list[asyncio.Future[None]] = []  # reservations waiting to fit

    @property
    def share(self) -> int:
        """What one client's reservations may take together."""
        return max(1, self.max_bytes // SHARES)

    def resize(self, max_bytes: int) -> None:
        """Take a reloaded bound: a raised one lets the reservations that now fit go at once,
        a lowered one holds the next back until what is held fits."""
        self.max_bytes = max_bytes
        self._wake()

    def waiting(self) -> int:
        """Reservations waiting to fit now."""
        return len(self._waiters)

    @contextlib.asynccontextmanager
    async def reserved(self, size: int, client: str | None = None) -> AsyncIterator[None]:
        """Hold `size` bytes for `client` for the block, once they fit (its own first)."""
        while not self._fits(size, client):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        charged = min(size, self.share)
        self.bytes += charged
        self.peak = max(self.peak, self.bytes)
        if client is not None:
            self._held[client] += size
        try:
            yield
        finally:
            self.bytes -= charged
            if client is not None:
                self._held[client] -= size
                if not self._held[client]:
                    del self._held[client]
            self._wake()

    def _fits(self, size: int, client: str | None) -> bool:
        charged = min(size, self.share)
        if self.bytes and self.bytes + charged > self.max_bytes:
            return False
        held = self._held[client] if client is not None else 0
        return not held or held + size <= self.share

    def _wake(self) -> None:
        """Something was given back: every waiter looks again whether it fits now."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
