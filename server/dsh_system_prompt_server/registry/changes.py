"""Change notifications: a growing revision and bounded per-subscriber buffers.

Publishing never waits on a subscriber. A subscriber that falls behind by more
than its buffer loses events, and is told so (`Missed`) at the point of the
gap, before any later event.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from .model import Action, ChangeEvent, Kind


@dataclass(frozen=True, slots=True)
class Missed:
    """Events `first_revision`..`resync_revision` (`count` of them) were dropped."""

    first_revision: int
    count: int
    resync_revision: int


class Subscription:
    """One subscriber's view of the feed; read with `await next()`."""

    def __init__(self, feed: ChangeFeed, capacity: int, revision: int) -> None:
        self.revision = revision
        self._feed = feed
        self._capacity = capacity
        self._queue: deque[ChangeEvent | Missed] = deque()
        self._gap: Missed | None = None
        self._ready = asyncio.Event()

    def offer(self, event: ChangeEvent) -> None:
        """Queue `event`, or widen the gap when the buffer is full."""
        if self._gap is not None:
            gap = self._gap
            self._gap = Missed(gap.first_revision, gap.count + 1, event.revision)
        elif len(self._queue) >= self._capacity:
            self._gap = Missed(event.revision, 1, event.revision)
        else:
            self._queue.append(event)
            self._ready.set()

    async def next(self) -> ChangeEvent | Missed:
        """The next event, or the notice of a gap once what came before it is read."""
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._gap is not None:
                gap, self._gap = self._gap, None
                return gap
            self._ready.clear()
            await self._ready.wait()

    def close(self) -> None:
        self._feed.unsubscribe(self)


class ChangeFeed:
    """Numbers changes and fans them out to subscribers without blocking."""

    def __init__(self) -> None:
        self.revision = 0
        self._subscribers: dict[Subscription, None] = {}

    def publish(self, kind: Kind, action: Action, name: str, scope: str | None) -> ChangeEvent:
        self.revision += 1
        event = ChangeEvent(self.revision, kind, action, name, scope)
        for subscriber in self._subscribers:
            subscriber.offer(event)
        return event

    def subscribe(self, capacity: int) -> Subscription:
        subscription = Subscription(self, capacity, self.revision)
        self._subscribers[subscription] = None
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.pop(subscription, None)

    def subscriber_count(self) -> int:
        return len(self._subscribers)
