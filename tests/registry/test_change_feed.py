"""The change feed's bounded buffers, in plain Python (no server needed)."""

from __future__ import annotations

from dsh_system_prompt_server.registry import Action, ChangeEvent, ChangeFeed, Kind, Missed


def publish(feed: ChangeFeed, count: int) -> None:
    for index in range(count):
        feed.publish(Kind.SECTION, Action.REGISTERED, f"s{index}", None)


async def test_a_full_buffer_turns_further_events_into_one_gap_after_the_queued_ones() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=3)
    publish(feed, 10)
    items = [await subscription.next() for _ in range(4)]
    assert [i.revision for i in items[:3] if isinstance(i, ChangeEvent)] == [1, 2, 3]
    assert items[3] == Missed(first_revision=4, count=7, resync_revision=10)


async def test_events_after_a_reported_gap_flow_again() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=1)
    publish(feed, 3)
    assert isinstance(await subscription.next(), ChangeEvent)
    assert await subscription.next() == Missed(2, 2, 3)
    publish(feed, 1)
    event = await subscription.next()
    assert isinstance(event, ChangeEvent) and event.revision == 4


async def test_a_slow_subscriber_does_not_affect_another() -> None:
    feed = ChangeFeed()
    slow = feed.subscribe(capacity=1)
    fast = feed.subscribe(capacity=100)
    publish(feed, 50)
    received = [await fast.next() for _ in range(50)]
    assert all(isinstance(item, ChangeEvent) for item in received)
    assert isinstance(await slow.next(), ChangeEvent)


async def test_unsubscribed_subscribers_receive_nothing_more() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=10)
    subscription.close()
    publish(feed, 5)
    assert feed.subscriber_count() == 0
    assert feed.revision == 5


async def test_an_unsubscribed_subscriber_holds_no_event_in_the_log() -> None:
    feed = ChangeFeed(history=4)
    subscription = feed.subscribe(capacity=1024)
    subscription.close()
    publish(feed, 10)
    assert not feed.covers(0) and feed.covers(6)


async def test_a_subscriber_resuming_within_the_history_reads_on_from_its_revision() -> None:
    feed = ChangeFeed(history=8)
    publish(feed, 6)
    subscription = feed.subscribe(capacity=16, after=3)
    assert not subscription.resync
    assert [(await subscription.next()).revision for _ in range(3)] == [4, 5, 6]  # type: ignore[union-attr]


async def test_a_subscriber_resuming_before_the_history_is_told_to_resync() -> None:
    feed = ChangeFeed(history=2)
    publish(feed, 6)
    subscription = feed.subscribe(capacity=16, after=1)
    assert subscription.resync and subscription.poll() is None


async def test_a_filter_runs_when_the_subscriber_reads() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=16, accepts=lambda event: event.name.endswith("1"))
    publish(feed, 3)
    item = await subscription.next()
    assert isinstance(item, ChangeEvent) and item.name == "s1"
    assert subscription.poll() is None


async def test_taking_the_pending_events_at_once_gives_what_reading_one_by_one_gives() -> None:
    feeds = [ChangeFeed(), ChangeFeed()]
    one_by_one, at_once = (
        feed.subscribe(capacity=5, accepts=lambda event: not event.name.endswith("3"))
        for feed in feeds
    )
    for feed in feeds:
        publish(feed, 9)
    polled = []
    while (item := one_by_one.poll()) is not None:
        polled.append(item)
    taken = at_once.take(100)
    assert taken == polled
    assert [i.name for i in taken if isinstance(i, ChangeEvent)] == ["s0", "s1", "s2", "s4"]
    assert taken[-1] == Missed(first_revision=6, count=4, resync_revision=9)


async def test_taking_stops_at_the_limit_and_the_rest_stays_pending() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=16)
    publish(feed, 5)
    first, rest = subscription.take(2), subscription.take(100)
    assert [i.revision for i in first if isinstance(i, ChangeEvent)] == [1, 2]
    assert [i.revision for i in rest if isinstance(i, ChangeEvent)] == [3, 4, 5]
