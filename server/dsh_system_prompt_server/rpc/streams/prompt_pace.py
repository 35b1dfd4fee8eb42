"""Prompt bytes written per second, every WatchPrompt stream together, clients in turn.

A WatchPrompt message is the whole prompt, and a peer's transport takes whole
prompts whether its application reads them or not: 256 watchers of a 3.5 MiB
scope that changes every 0.2 s made the sidecar copy 4 GiB a second into gRPC
(and rebuild the shared prompt for every revision they were sent), and every
other caller waited behind those copies, p50 x12-22. The prompts-in-flight bound
(`in_flight.py`) does not pace them, since such writes complete.

So a prompt's write takes a turn of this pace first, and the pace lets the next
turn go only once the bytes written so far fit `prompt_bytes_per_s` (a virtual
clock: each message moves the time the pace is free again by its size over the
rate; time unused is not saved up, so a quiet sidecar's first prompt goes at
once). A watcher that waits sends the latest revision when its turn comes, with
every change since its last message: WatchPrompt coalesces, so a slow watcher
gets fewer, later prompts, never stale ones. Clients take turns (one waiter of
each client with waiters in rotation; a client the sidecar cannot tell apart is
one client), so one client's thousand watchers delay another's by one message
each round, not by a thousand. The shared prompt is rebuilt within a turn, so it
is rebuilt no more often than the pace sends it.

With a rate set, one turn is out at a time. A turn granted with none set counts too,
until it is spent: a reload that sets a rate while such turns are out grants the next
turn only once they are all spent, never one beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator


class Paced:
    """One granted turn: `spent(size)` charges the message it writes and passes the turn on
    once the rate allows; a turn left unspent passes on at once."""

    def __init__(self, pace: PromptPace) -> None:
        self._pace = pace
        self.over = False

    def spent(self, size: int) -> None:
        if not self.over:
            self.over = True
            self._pace._spent(size)


class PromptPace:
    """Turns for prompt writes, at most `bytes_per_s` written per second (0: no bound)."""

    def __init__(self, bytes_per_s: int) -> None:
        self.bytes_per_s = bytes_per_s
        self.written = 0  # bytes charged, ever
        self._free_at = 0.0  # loop time from which the bytes charged so far are paid for
        self._out = 0  # turns granted, not yet spent (those granted with no bound too)
        self._timer: asyncio.TimerHandle | None = None  # the next grant, once the rate allows
        # each client's waiters, in arrival order; clients in turn (the dict's order)
        self._queues: dict[str | None, deque[asyncio.Future[None]]] = {}

    def resize(self, bytes_per_s: int) -> None:
        """Take a reloaded rate: the bytes charged and not yet paid for are paid at it from
        now on (none to pay with no bound), so waiters are not held to the old rate's timer."""
        before, self.bytes_per_s = self.bytes_per_s, bytes_per_s
        if self._free_at:  # something was charged (so on the loop), maybe not yet paid for
            now = asyncio.get_running_loop().time()
            owed = max(self._free_at - now, 0.0) * before  # bytes, at the rate they were charged
            self._free_at = now + owed / bytes_per_s if bytes_per_s else 0.0
        if self._timer is not None:  # set for the old rate's time
            self._timer.cancel()
            self._timer = None
        self._schedule()

    def waiting(self) -> int:
        """Turns waiting now."""
        return sum(not future.done() for queue in self._queues.values() for future in queue)

    @contextlib.asynccontextmanager
    async def turn(self, client: str | None) -> AsyncIterator[Paced]:
        """Wait for `client`'s turn to write one prompt; the block builds it and spends it."""
        if self.bytes_per_s:
            await self._granted(client)
        else:
            self._out += 1  # out at once, but out: a rate a reload sets waits for it
        paced = Paced(self)
        try:
            yield paced
        finally:
            paced.spent(0)  # unspent (its block failed): the next one's turn now

    async def _granted(self, client: str | None) -> None:
        """Wait in `client`'s queue until the grant counts this turn out."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(client, deque()).append(future)
        self._schedule()
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():  # granted as it was cancelled
                self._out -= 1
                self._schedule()
            future.cancel()  # left in its queue: the grant passes over it
            raise

    def _spent(self, size: int) -> None:
        loop = asyncio.get_running_loop()
        self.written += size
        if self.bytes_per_s:
            self._free_at = max(self._free_at, loop.time()) + size / self.bytes_per_s
        self._out -= 1
        self._schedule()

    def _schedule(self) -> None:
        """Grant the next turn now if the rate allows, or set the timer for when it will."""
        if (self.bytes_per_s and self._out) or self._timer is not None or not self._queues:
            return
        loop = asyncio.get_running_loop()
        if self.bytes_per_s and self._free_at > loop.time():
            self._timer = loop.call_at(self._free_at, self._timed)
            return
        self._grant()

    def _timed(self) -> None:
        self._timer = None
        self._schedule()

    def _grant(self) -> None:
        """Give the turn to the first client's first live waiter; that client goes last."""
        while self._queues:
            client = next(iter(self._queues))
            queue = self._queues.pop(client)
            while queue and queue[0].done():  # its waiter gave up
                queue.popleft()
            if not queue:
                continue
            future = queue.popleft()
            if queue:
                self._queues[client] = queue  # back of the rotation
            future.set_result(None)
            self._out += 1
            if self.bytes_per_s:  # one at a time; with no bound, every waiter at once
                return
