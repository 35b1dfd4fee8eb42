"""Turns for background writers: a few writes in flight at once, the others queued in order.

A change fanned out to a thousand watchers is a thousand stream writes. Started
at once, they queue ahead of every caller's next step, in the event loop and in
gRPC's transport alike, and a registration waits for the whole fan-out. A
watcher takes a turn before each write instead, and gives it back when the
write is done: with a few writes in flight, a caller's step waits for a few
writes at most, and the watchers use whatever time the callers leave. A turn
is lent for `lease_s` at most, so a peer that does not read holds no one up.
"""

from __future__ import annotations

import asyncio
from collections import deque

SLOTS = 1  # watcher writes in flight at once (2 doubled the callers' wait in the bench)
LEASE_S = 0.01  # a write still unfinished after this gives its turn up anyway


class Turn:
    """One writer's turn; `done()` gives it back (at the latest, the lease does)."""

    def __init__(self, turns: Turns, lease_s: float) -> None:
        self._turns = turns
        self._lease = asyncio.get_running_loop().call_later(lease_s, self.done)
        self._given_back = False

    @property
    def over(self) -> bool:
        """Whether the turn was given back (by `done()` or its lease running out)."""
        return self._given_back

    def done(self) -> None:
        if not self._given_back:
            self._given_back = True
            self._lease.cancel()
            self._turns.give_back()


class Turns:
    """At most `slots` turns out at once; `await take()` waits for one, first come first served."""

    def __init__(self, slots: int = SLOTS, lease_s: float = LEASE_S) -> None:
        self._free = slots
        self._lease_s = lease_s
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.taken = 0  # turns handed out so far

    async def take(self) -> Turn:
        """This writer's turn, once the writers queued before it had theirs."""
        self.taken += 1
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return Turn(self, self._lease_s)
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # handed over as it was cancelled
                self.give_back()
            raise
        return Turn(self, self._lease_s)

    def waiting(self) -> int:
        """Writers waiting for a turn now."""
        return len(self._waiting)

    def give_back(self) -> None:
        """A turn ends: hand it to the next writer still waiting, else keep it free."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a writer cancelled while waiting wants it no more
                turn.set_result(None)
                return
        self._free += 1
