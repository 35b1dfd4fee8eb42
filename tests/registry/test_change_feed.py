"""The change feed's bounded buffers, in plain Python (no server needed)."""

from __future__ import annotations

from dsh_system_prompt_server.registry import Action, ChangeEvent, ChangeFeed, Kind, Missed


def publish(feed: ChangeFeed, count: int) -> None:
    for index in range(count):
        feed.publish(Kind.SECTION, Action.REGISTERED, f"s{index}", None)


async def test_a_subscriber_more_than_its_buffer_behind_is_told_at_once_of_all_it_missed() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=3)
    publish(feed, 3)
    assert isinstance(subscription.poll(), ChangeEvent)  # 3 unread: not behind
    publish(feed, 7)  # 9 unread: its next read is the gap, before the events it had not read
    assert await subscription.next() == Missed(first_revision=2, count=9, resync_revision=10)
    assert subscription.poll() is None


async def test_events_after_a_reported_gap_flow_again() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=1)
    publish(feed, 3)
    assert await subscription.next() == Missed(1, 3, 3)
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
    assert await slow.next() == Missed(1, 50, 50)


async def test_an_event_unread_for_max_lag_puts_its_subscriber_behind() -> None:
    now = [0.0]
    feed = ChangeFeed(clock=lambda: now[0])
    subscription = feed.subscribe(capacity=100, max_lag_s=2)
    publish(feed, 3)
    now[0] = 1.5
    assert [i.revision for i in subscription.take(1) if isinstance(i, ChangeEvent)] == [1]
    now[0] = 2.5  # revisions 2 and 3 have waited 2.5 s: told, not sent
    assert subscription.take(100) == [Missed(2, 2, 3)]
    publish(feed, 1)
    now[0] = 4.0
    event = subscription.poll()
    assert isinstance(event, ChangeEvent) and event.revision == 4


async def test_replayed_events_wait_from_the_subscription_not_their_publication() -> None:
    now = [0.0]
    feed = ChangeFeed(history=8, clock=lambda: now[0])
    publish(feed, 6)
    now[0] = 100.0
    subscription = feed.subscribe(capacity=16, after=3, max_lag_s=2)
    now[0] = 101.0
    assert [(await subscription.next()).revision for _ in range(3)] == [4, 5, 6]  # type: ignore[union-attr]


async def test_a_subscriber_whose_unread_events_leave_the_log_is_behind() -> None:
    feed = ChangeFeed(history=4)
    publish(feed, 4)
    replaying = feed.subscribe(capacity=2, after=0)  # all four to replay: the log keeps them
    publish(feed, 2)  # the log drops 1 and 2, which it had not read
    assert replaying.poll() == Missed(1, 6, 6)


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
        feed.subscribe(capacity=9, accepts=lambda event: not event.name.endswith("3"))
        for feed in feeds
    )
    for feed in feeds:
        publish(feed, 9)
    polled = []
    while (item := one_by_one.poll()) is not None:
        polled.append(item)
    taken = at_once.take(100)
    assert taken == polled
    names = ["s0", "s1", "s2", "s4", "s5", "s6", "s7", "s8"]
    assert [i.name for i in taken if isinstance(i, ChangeEvent)] == names
    for feed in feeds:
        publish(feed, 10)
    assert at_once.take(100) == [one_by_one.poll()] == [Missed(10, 10, 19)]


async def test_taking_stops_at_the_limit_and_the_rest_stays_pending() -> None:
    feed = ChangeFeed()
    subscription = feed.subscribe(capacity=16)
    publish(feed, 5)
    first, rest = subscription.take(2), subscription.take(100)
    assert [i.revision for i in first if isinstance(i, ChangeEvent)] == [1, 2]
    assert [i.revision for i in rest if isinstance(i, ChangeEvent)] == [3, 4, 5]
