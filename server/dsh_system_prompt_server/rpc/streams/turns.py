"""Turns for background writers: a few writes in flight at once, the others queued in order.

A change fanned out to a thousand watchers is a thousand stream writes. Started
at once, they queue ahead of every caller's next step, in the event loop and in
gRPC's transport alike, and a registration waits for the whole fan-out. A
watcher takes a turn before it writes instead, and gives it back when done:
with a few writes in flight, a caller's step waits for a few writes at most,
and the watchers use whatever time the callers leave.

A turn is bounded by what it writes, not by its messages: its writer starts no
further message once it has written `turn_bytes`, or, while others wait, once
`turn_s` has passed (with many waiting, its share of `round_s`: one message at
least); and a turn, even one write unfinished, is given up after `lease_s`, so
a peer that does not read holds no one up.

Writers that keep up (what they have pending goes in one turn: a batching
watcher's next batch) wait in a queue of their own, apart from writers with a
backlog (a watcher that takes its changes one message each, in a burst): when
both wait, turns alternate between the two queues, so one that keeps up waits
for one backlog's turn at most, never for a turn of each of them, and a backlog
still gets every other turn. etcd serves its synced watchers apart from the
unsynced ones catching up the same way.
"""

from __future__ import annotations

import asyncio
from collections import deque

SLOTS = 1  # watcher writes in flight at once (2 doubled the callers' wait in the bench)
LEASE_S = 0.01  # a write still unfinished after this gives its turn up anyway
TURN_BYTES = 64 * 1024  # a turn starts no further message once it wrote this much,
TURN_S = 0.002  # or after this long,
ROUND_S = 0.1  # or after its share of this among the writers waiting: 1,000 take 0.1 s


class Turn:
    """One writer's turn; `spent()` counts what it writes, `done()` gives it back (at the
    latest, the lease does)."""

    def __init__(self, turns: Turns) -> None:
        self._turns = turns
        loop = asyncio.get_running_loop()
        self._began = loop.time()
        self._time_s = min(turns.turn_s, turns.round_s / max(1, turns.waiting()))
        self._lease = loop.call_later(turns.lease_s, self.done)
        self._given_back = False
        self.bytes = 0  # written in this turn

    @property
    def over(self) -> bool:
        """Whether its writer should start no further message: the turn was given back, or
        it wrote `turn_bytes`, or its time passed while others wait (alone, its lease
        bounds it)."""
        if self._given_back or self.bytes >= self._turns.turn_bytes:
            return True
        elapsed = asyncio.get_running_loop().time() - self._began
        return elapsed >= self._time_s and self._turns.waiting() > 0

    def spent(self, size: int) -> None:
        """A message of `size` bytes was written (or is being written) in this turn."""
        self.bytes += size

    def done(self) -> None:
        if not self._given_back:
            self._given_back = True
            self._lease.cancel()
            self._turns.give_back()


class Turns:
    """At most `slots` turns out at once; `await take(behind)` waits for one, first come
    first served within its queue, the queues taking turns (module docstring)."""

    def __init__(
        self,
        slots: int = SLOTS,
        lease_s: float = LEASE_S,
        turn_bytes: int = TURN_BYTES,
        turn_s: float = TURN_S,
        round_s: float = ROUND_S,
    ) -> None:
        self._free = slots
        self.lease_s = lease_s
        self.turn_bytes = turn_bytes
        self.turn_s = turn_s
        self.round_s = round_s
        self._keeping_up: deque[asyncio.Future[None]] = deque()
        self._behind: deque[asyncio.Future[None]] = deque()
        self._last_behind = False  # whom the last turn handed over went to
        self.taken = 0  # turns handed out so far

    async def take(self, behind: bool = False) -> Turn:
        """A turn for a writer, once those queued before it in its queue had theirs;
        `behind`: what it has pending takes more than one turn."""
        self.taken += 1
        if self._free > 0 and not self.waiting():
            self._free -= 1
            return Turn(self)
        turn = asyncio.get_running_loop().create_future()
        (self._behind if behind else self._keeping_up).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # handed over as it was cancelled
                self.give_back()
            raise
        return Turn(self)

    def waiting(self) -> int:
        """Writers waiting for a turn now (a few of them may have been cancelled)."""
        return len(self._keeping_up) + len(self._behind)

    def give_back(self) -> None:
        """A turn ends: hand it to the next writer still waiting, the queues alternating,
        else keep it free."""
        while self._keeping_up or self._behind:
            behind = bool(self._behind) and (not self._last_behind or not self._keeping_up)
            turn = (self._behind if behind else self._keeping_up).popleft()
            if not turn.done():  # a writer cancelled while waiting wants it no more
                self._last_behind = behind
                turn.set_result(None)
                return
        self._free += 1
