"""Bytes being written to a kind of stream, all streams together, bounded.

A WatchPrompt message is the whole prompt: each watcher of a 3.5 MiB scope holds
its own copy until its peer takes it (the shared encoding joined with its own
changes, then gRPC's copy), so 256 watchers that read once and stop held 1.8 GiB
for their write timeout. A writer reserves its message's size before it builds
it and gives it back once it is written: past the bound the others wait (and then
send the latest prompt), so what the watchers hold is the bound, not their number.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class InFlight:
    """At most `max_bytes` reserved at once; one reservation larger than that alone."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0  # reserved now
        self.peak = 0  # the most ever reserved at once
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def reserved(self, size: int) -> AsyncIterator[None]:
        """Hold `size` bytes for the block, once they fit (or nothing else is held)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: not self.bytes or self.bytes + size <= self.max_bytes
            )
            self.bytes += size
            self.peak = max(self.peak, self.bytes)
        try:
            yield
        finally:
            self.bytes -= size
            async with self._changed:
                self._changed.notify_all()
