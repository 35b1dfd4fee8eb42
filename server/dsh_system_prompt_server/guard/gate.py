"""The drain gate: refuses new calls once draining, and knows when in-flight ones end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from ..wire import shutting_down


class Gate:
    """Counts calls in flight; after `close()` new calls fail UNAVAILABLE."""

    def __init__(self) -> None:
        self.draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def check(self) -> None:
        """Raise UNAVAILABLE when draining (for streams that outlive the drain)."""
        if self.draining:
            raise shutting_down()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Hold the gate open for one call; raises when draining."""
        self.check()
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    def close(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait for in-flight calls to finish; False when `timeout` ran out first."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True
