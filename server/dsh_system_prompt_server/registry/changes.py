"""Change notifications: a growing revision, one shared log and a cursor per subscriber.

Publishing costs the same however many subscribers there are: the event is
appended to one log, and waiting subscribers are woken in small batches by a
task of its own, so the caller that made the change never pays for the fan-out.

A subscriber is behind once more than its capacity of events published since it
subscribed wait for it, or (with `max_lag_s`) once the oldest event waiting for it
has waited that long. Behind, it is told so at once (`Missed`), before any of the
events it had not read: one gap covering every one of them, then events flow
again from the latest. Its buffered events would only delay the notice, and a
subscriber told of a gap re-reads the state anyway (etcd cancels a watcher whose
revision was compacted, Kubernetes answers "too old resource version").

The log also keeps the last `history` events whoever reads them, so that a
subscriber that comes back names the last revision it saw and reads on from
there (or is told to resync, when the log no longer reaches back so far). A
subscriber's filter runs when it reads, at its own cost.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .filters import public_ref
from .model import Action, AnyRegistration, ChangeEvent, Kind, runs_everywhere

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
    watch); `resync` says the past it asked for is no longer kept. Events
    replayed from the past count as waiting from the subscription on.
    """

    def __init__(
        self,
        feed: ChangeFeed,
        capacity: int,
        revision: int,
        start: int,
        accepts: Accepts,
        max_lag_s: float | None,
    ) -> None:
        self.revision = revision
        self.resync = False
        self._feed = feed
        self._capacity = capacity
        self._accepts = accepts
        self._max_lag_s = max_lag_s
        self._since = feed.clock()  # when it subscribed: replayed events wait from then
        self.cursor = start  # the next revision to read
        self._behind = False  # its next read is the gap: it missed every event unread
        self._waiter: asyncio.Future[None] | None = None

    async def next(self) -> ChangeEvent | Missed:
        """The next wanted event, or the notice of a gap once it is behind."""
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
        if self._judge():
            return self._report_gap()
        feed = self._feed
        while self.cursor <= feed.revision:
            event = feed.event(self.cursor)
            feed.move(self, self.cursor + 1)
            if self._accepts is None or self._accepts(event):
                return event
        return None

    def take(self, limit: int) -> list[ChangeEvent | Missed]:
        """What `poll()` would return one by one now, up to `limit` events read (a gap is
        returned alone: everything unread is in it)."""
        if self._judge():
            return [self._report_gap()]
        feed, start = self._feed, self.cursor
        end = min(feed.revision + 1, start + limit)
        if end <= start:
            return []
        events = feed.events(start, end)
        feed.move(self, end)
        accepts = self._accepts
        return list(events) if accepts is None else [event for event in events if accepts(event)]

    def unread(self) -> int:
        """Events published that it has not read yet, its filter's or not."""
        return max(0, self._feed.revision - self.cursor + 1)

    def close(self) -> None:
        self._feed.unsubscribe(self)

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def fall_behind(self) -> None:
        """The log drops an event this subscriber has not read: it is behind."""
        self._behind = True

    def _judge(self) -> bool:
        """Whether it is behind: more than `capacity` events published since it subscribed
        unread, or the oldest unread one waiting longer than `max_lag_s`."""
        if self._behind:
            return True
        feed = self._feed
        if self.cursor > feed.revision:
            return False
        if feed.revision - max(self.cursor - 1, self.revision) > self._capacity:
            self._behind = True
        elif self._max_lag_s is not None:
            waiting_since = max(self._since, feed.published(self.cursor))
            self._behind = feed.clock() - waiting_since > self._max_lag_s
        return self._behind

    def _report_gap(self) -> Missed:
        latest, first = self._feed.revision, self.cursor
        self._behind = False
        self._feed.move(self, latest + 1)
        return Missed(first_revision=first, count=latest - first + 1, resync_revision=latest)


class ChangeFeed:
    """Numbers changes and keeps them in one log for the subscribers still to read them."""

    def __init__(self, history: int = 1024, clock: Callable[[], float] = time.monotonic) -> None:
        self.revision = 0
        self.history = history  # events kept for subscribers that come back
        self.clock = clock  # when events are published, and how long they wait
        self._log: deque[ChangeEvent] = deque()  # revisions _first, _first + 1, ...
        self._times: deque[float] = deque()  # when each event of the log was published
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
        everywhere: bool = False,
        rebound: tuple[str, ...] = (),
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
            everywhere=everywhere,
            rebound=rebound,
        )
        self._log.append(event)
        self._times.append(self.clock())
        self._trim()
        if self._waiting and self._waker is None:
            self._waker = asyncio.get_running_loop().create_task(self._wake())
        return event

    def publish_entry(
        self,
        entry: AnyRegistration,
        action: Action,
        fingerprint: str,
        reason: str,
        rebound: tuple[str, ...] = (),
    ) -> ChangeEvent:
        """The change of a registration: named by its public ref, everywhere when it is a
        step registered with `global`, naming the scope keys it re-bound."""
        return self.publish(
            entry.kind,
            action,
            entry.name,
            entry.scope,
            public_ref(entry.id),
            fingerprint,
            reason,
            everywhere=runs_everywhere(entry),
            rebound=rebound,
        )

    def subscribe(
        self,
        capacity: int,
        after: int | None = None,
        accepts: Accepts = None,
        max_lag_s: float | None = None,
    ) -> Subscription:
        """Subscribe to the events after now, or, with `after`, after that revision; it is
        behind past `capacity` events unread, or an event unread for `max_lag_s`.

        When the log no longer holds every event after `after` (or it is ahead
        of this feed), the subscription is marked `resync` and starts now.
        """
        start = self.revision + 1
        if after is not None and self.covers(after):
            start = after + 1
        subscription = Subscription(self, capacity, self.revision, start, accepts, max_lag_s)
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

    def published(self, revision: int) -> float:
        """When the logged event `revision` was published (`clock`'s time)."""
        return self._times[revision - self._first]

    def events(self, start: int, end: int) -> list[ChangeEvent]:
        """The logged events from revision `start` up to, not including, `end`."""
        return list(itertools.islice(self._log, start - self._first, end - self._first))

    def move(self, subscription: Subscription, cursor: int) -> None:
        """`subscription` reads from `cursor` on."""
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
        # event the log must drop has more than its capacity unread: it is behind, and
        # its next read is the gap.
        while len(self._log) > self.history and (
            self._first not in self._at or len(self._log) > self._keep
        ):
            for subscription in self._at.pop(self._first, {}):
                subscription.fall_behind()
            self._log.popleft()
            self._times.popleft()
            self._first += 1

    async def _wake(self) -> None:
        try:
            while self._waiting:
                for _ in range(min(WAKE_BATCH, len(self._waiting))):
                    self._waiting.popleft().wake()
                await asyncio.sleep(PAUSE_S)  # let calls in between be served first
        finally:
            self._waker = None
