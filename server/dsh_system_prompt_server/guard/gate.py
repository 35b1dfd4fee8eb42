"""The drain gate: refuses new calls once draining, and knows when in-flight ones end."""

from __future__ import annotations

import asyncio
from types import TracebackType

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

    def call(self) -> Gate:
        """Hold the gate open for one call (`with gate.call():`); raises when draining."""
        return self  # its own context manager: no generator per call, on every call's path

    def __enter__(self) -> None:
        self.check()
        self._in_flight += 1
        self._idle.clear()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
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
