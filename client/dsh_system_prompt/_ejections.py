"""Ejected callbacks come back (docs/protocol.md, "Ejected callbacks").

The sidecar ejects a provider or listener that did not answer in time: it
disposes it and says so on the owner's stream. This client then makes the same
registration again on the same session, after a backoff that doubles with each
ejection of it, so the handle the agent holds stays valid and a callback that
is stuck for good costs the sidecar one timeout per backoff, not one per assembly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from ._replay import Registration

_log = logging.getLogger("dsh_system_prompt")
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
CALM_S = 60.0  # an ejection this long after the last one starts the backoff again

Make = Callable[[Registration, str], Awaitable[None]]
"""Make a record again on the session of that id, if it is still the current one."""


class Reinstalls:
    """The re-installs waiting for their backoff, and each record's last ejections."""

    def __init__(self, make: Make) -> None:
        self._make = make
        self._ejections: dict[Registration, tuple[int, float]] = {}  # count, when last
        self._waiting: set[asyncio.Task[None]] = set()

    def ejected(self, record: Registration, session_id: str, why: str) -> None:
        """The sidecar ejected `record` from the session `session_id`: make it again later."""
        delay = self._backoff(record)
        # %r: `why` is the sidecar's text, naming the callback; its controls stay escapes
        _log.warning("the sidecar ejected a callback (%r); registering it again in %gs", why, delay)
        self._schedule(record, session_id, delay)

    def lost(self, record: Registration, session_id: str, why: str) -> None:
        """The sidecar closed the stream of `record`'s listener while its session lives
        (it keeps the listener's place, failing what it would see, until it is back):
        install it again on that session, at once the first time, then with the backoff
        (a stream closed again and again costs the sidecar one install per backoff)."""
        delay = self._backoff(record) - FIRST_BACKOFF_S  # 0 the first time
        _log.warning(
            "the sidecar closed a listener's stream (%r); installing it again in %gs", why, delay
        )
        self._schedule(record, session_id, delay)

    def _backoff(self, record: Registration) -> float:
        count, last = self._ejections.get(record, (0, 0.0))
        now = time.monotonic()
        count = 1 if now - last > CALM_S else count + 1
        self._ejections[record] = (count, now)
        return float(min(FIRST_BACKOFF_S * 2 ** (count - 1), MAX_BACKOFF_S))

    def _schedule(self, record: Registration, session_id: str, delay: float) -> None:
        task = asyncio.create_task(self._later(record, session_id, delay))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    def pending(self) -> int:
        """Re-installs still waiting or under way."""
        return len(self._waiting)

    async def close(self) -> None:
        for task in list(self._waiting):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ejections.clear()

    async def _later(self, record: Registration, session_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._make(record, session_id)
