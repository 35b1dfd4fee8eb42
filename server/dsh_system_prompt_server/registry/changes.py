"""Change notifications: a growing revision, one shared log and a cursor per subscriber.

Publishing costs the same however many subscribers there are: the event is
appended to one log, and waiting subscribers are woken in small batches by a
task of its own, so the caller that made the change never pays for the fan-out.

A subscriber that falls behind by more than its capacity loses events, and is
told so (`Missed`) at the point of the gap, before any later event: it reads
the `capacity` events that followed its cursor, then one gap covering every
event published until it reads the gap, then events flow again.

The log also keeps the last `history` events whoever reads them, so that a
subscriber that comes back names the last revision it saw and reads on from
there (or is told to resync, when the log no longer reaches back so far). A
subscriber's filter runs when it reads, at its own cost.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .model import Action, ChangeEvent, Kind

WAKE_BATCH = 64  # subscribers woken before the loop serves anything else
PAUSE_S = 0.001  # between batches: pending calls go first, watchers catch up after

# Whether a subscriber wants an event (its filter); None wants every event.
Accepts = Callable[[ChangeEvent], bool] | None


@dataclass(frozen=True, slots=True)
class Missed:
    """Events `first_revision`..`resync_revision` (`count` of them) were dropped."""

    first_revision: int
    count: int
    resync_revision: int


class Subscription:
    """One subscriber's view of the feed; read with `await next()`.

    It reads from revision `start`, which may be in the past (a resumed
    watch); `resync` says the past it asked for is no longer kept.
    """

    def __init__(
        self, feed: ChangeFeed, capacity: int, revision: int, start: int, accepts: Accepts
    ) -> None:
        self.revision = revision
        self.resync = False
        self._feed = feed
        self._capacity = capacity
        self._accepts = accepts
        self.cursor = start  # the next revision to read
        self._seen = revision  # the latest revision already judged queued or missed
        self._gap_from: int | None = None
        # Events kept for this subscriber alone once the shared log moved past them.
        self._detached: deque[ChangeEvent] | None = None
        self._waiter: asyncio.Future[None] | None = None

    async def next(self) -> ChangeEvent | Missed:
        """The next wanted event, or the notice of a gap once what came before it is read."""
        while True:
            item = self.poll()
            if item is not None:
                return item
            self._waiter = asyncio.get_running_loop().create_future()
            self._feed.wait(self)
            try:
                await self._waiter
            finally:
                self._waiter = None

    def poll(self) -> ChangeEvent | Missed | None:
        """The next wanted event or gap notice if one is there now, else None (never waits)."""
        while True:
            item = self._take()
            if item is None or isinstance(item, Missed):
                return item
            if self._accepts is None or self._accepts(item):
                return item

    def take(self, limit: int) -> list[ChangeEvent | Missed]:
        """What `poll()` would return one by one now, up to `limit` events read, ending at a gap."""
        if self._detached is not None:
            taken: list[ChangeEvent | Missed] = []
            while len(taken) < limit and (item := self.poll()) is not None:
                taken.append(item)
                if isinstance(item, Missed):
                    break
            return taken
        self._judge()
        feed, start = self._feed, self.cursor
        end = min(feed.revision + 1 if self._gap_from is None else self._gap_from, start + limit)
        events = feed.events(start, end) if end > start else []
        if events:
            feed.move(self, end)
        accepts = self._accepts
        items: list[ChangeEvent | Missed] = (
            list(events) if accepts is None else [event for event in events if accepts(event)]
        )
        if self._gap_from == self.cursor and len(events) < limit:
            items.append(self._report_gap())
        return items

    def _take(self) -> ChangeEvent | Missed | None:
        feed = self._feed
        if self._detached is not None:
            if self._detached:
                return self._detached.popleft()
            return self._report_gap()
        self._judge()
        if self._gap_from == self.cursor:
            return self._report_gap()
        if self.cursor <= feed.revision:
            event = feed.event(self.cursor)
            feed.move(self, self.cursor + 1)
            return event
        return None

    def close(self) -> None:
        self._feed.unsubscribe(self)

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def detach(self) -> None:
        """Copy what this subscriber still reads out of the shared log (its buffer is full)."""
        self._judge()
        end = self._feed.revision + 1 if self._gap_from is None else self._gap_from
        self._detached = deque(self._feed.events(self.cursor, end))

    def _judge(self) -> None:
        # Events published since the last call all found the same cursor: those
        # past `capacity` of it start the gap (once started, it takes every event).
        latest = self._feed.revision
        if self._gap_from is None and latest > self._seen:
            limit = self.cursor + self._capacity - 1
            if latest > limit:
                self._gap_from = max(self._seen + 1, limit + 1)
        self._seen = latest

    def _report_gap(self) -> Missed:
        assert self._gap_from is not None
        latest = self._feed.revision
        gap = Missed(
            first_revision=self._gap_from,
            count=latest - self._gap_from + 1,
            resync_revision=latest,
        )
        self._gap_from, self._detached, self._seen = None, None, latest
        self._feed.move(self, latest + 1)
        return gap


class ChangeFeed:
    """Numbers changes and keeps them in one log for the subscribers still to read them."""

    def __init__(self, history: int = 1024) -> None:
        self.revision = 0
        self.history = history  # events kept for subscribers that come back
        self._log: deque[ChangeEvent] = deque()  # revisions _first, _first + 1, ...
        self._first = 1
        self._keep = 0  # the largest capacity: a longer log means someone's buffer is full
        self._at: dict[int, dict[Subscription, None]] = {}  # cursor -> subscribers there
        self._subscribers: dict[Subscription, None] = {}
        self._waiting: deque[Subscription] = deque()
        self._waker: asyncio.Task[None] | None = None

    def publish(
        self,
        kind: Kind,
        action: Action,
        name: str,
        scope: str | None,
        ref: str = "",
        fingerprint: str = "",
        reason: str = "",
    ) -> ChangeEvent:
        self.revision += 1
        event = ChangeEvent(
            revision=self.revision,
            kind=kind,
            action=action,
            name=name,
            scope=scope,
            ref=ref,
            fingerprint=fingerprint,
            reason=reason,
        )
        self._log.append(event)
        self._trim()
        if self._waiting and self._waker is None:
            self._waker = asyncio.get_running_loop().create_task(self._wake())
        return event

    def subscribe(
        self, capacity: int, after: int | None = None, accepts: Accepts = None
    ) -> Subscription:
        """Subscribe to the events after now, or, with `after`, after that revision.

        When the log no longer holds every event after `after` (or it is ahead
        of this feed), the subscription is marked `resync` and starts now.
        """
        start = self.revision + 1
        if after is not None and self.covers(after):
            start = after + 1
        subscription = Subscription(self, capacity, self.revision, start, accepts)
        subscription.resync = (
            after is not None and start == self.revision + 1 and (after != self.revision)
        )
        self._subscribers[subscription] = None
        self._keep = max(self._keep, capacity)
        self._at.setdefault(subscription.cursor, {})[subscription] = None
        return subscription

    def covers(self, after: int) -> bool:
        """Whether every event after revision `after` is still in the log."""
        return self._first - 1 <= after <= self.revision

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription not in self._subscribers:  # the dict's values are all None
            return
        del self._subscribers[subscription]
        self._leave(subscription)

    def subscriber_count(self) -> int:
        return len(self._subscribers)

    # -- for subscriptions ------------------------------------------------------------

    def event(self, revision: int) -> ChangeEvent:
        return self._log[revision - self._first]

    def events(self, start: int, end: int) -> list[ChangeEvent]:
        """The logged events from revision `start` up to, not including, `end`."""
        return list(itertools.islice(self._log, start - self._first, end - self._first))

    def move(self, subscription: Subscription, cursor: int) -> None:
        """`subscription` reads from `cursor` on (in the shared log again, if detached)."""
        self._leave(subscription)
        subscription.cursor = cursor
        if subscription in self._subscribers:
            self._at.setdefault(cursor, {})[subscription] = None

    def wait(self, subscription: Subscription) -> None:
        self._waiting.append(subscription)

    # -- helpers ----------------------------------------------------------------------

    def _leave(self, subscription: Subscription) -> None:
        there = self._at.get(subscription.cursor)
        if there is not None and there.pop(subscription, 0) is None and not there:
            del self._at[subscription.cursor]

    def _trim(self) -> None:
        # Drop what no subscriber in the log still reads; a subscriber still at an
        # event the log must drop (its buffer is full) keeps its events to itself.
        while len(self._log) > self.history and (
            self._first not in self._at or len(self._log) > self._keep
        ):
            for subscription in self._at.pop(self._first, {}):
                subscription.detach()
            self._log.popleft()
            self._first += 1

    async def _wake(self) -> None:
        try:
            while self._waiting:
                for _ in range(min(WAKE_BATCH, len(self._waiting))):
                    self._waiting.popleft().wake()
                await asyncio.sleep(PAUSE_S)  # let calls in between be served first
        finally:
            self._waker = None
