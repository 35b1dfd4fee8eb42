"""A flag that parts of a stream set and others wait for, at a fraction of asyncio.Event's size.

Every open stream has three: its host's end, its outbox's stall, and whether its outbox is
idle. An `asyncio.Event` makes a deque for its waiters up front (380 bytes an Event with it,
for waiters that most flags never have), and a stream waited for the first of its ends with
a task for each. A `Flag` holds its waiters only while it has some, and calls callbacks as
well as waking waiters, so one future waits for the first of several flags (broker.run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Callback = Callable[[], None]


class Flag:
    """Set or not; `await wait()` returns once it is set (at once if it is)."""

    __slots__ = ("_is_set", "_waiters")

    def __init__(self, is_set: bool = False) -> None:
        self._is_set = is_set
        # futures waiting and callbacks to call at the next set(); None while there are none
        self._waiters: list[asyncio.Future[None] | Callback] | None = None

    def is_set(self) -> bool:
        return self._is_set

    def set(self) -> None:
        """Set it: wake every waiter and call every callback, once."""
        if self._is_set:
            return
        self._is_set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_result(None)
            else:
                waiter()

    def clear(self) -> None:
        self._is_set = False

    async def wait(self) -> None:
        if self._is_set:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._add(waiter)
        try:
            await waiter
        finally:
            self.forget(waiter)

    def on_set(self, callback: Callback) -> None:
        """Call `callback` once it is set (now, if it is)."""
        if self._is_set:
            callback()
        else:
            self._add(callback)

    def forget(self, waiter: asyncio.Future[None] | Callback) -> None:
        """`waiter` waits no more (a callback not called yet is not called)."""
        if self._waiters is not None and waiter in self._waiters:
            self._waiters.remove(waiter)
            if not self._waiters:
                self._waiters = None

    def _add(self, waiter: asyncio.Future[None] | Callback) -> None:
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
