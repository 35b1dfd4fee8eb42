"""The arithmetic of the clients' shares (guard/shares.py) on its own, with a clock the
test moves: use and lateness decayed over the window, the equal split and its floor, the
waits for a share, and what a drain, a reload or a cancel does to the calls waiting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import time

import pytest
from dsh_system_prompt_server.guard.clients import CALLER, client_of
from dsh_system_prompt_server.guard.shares import ANONYMOUS, Shares, ShareSettings, share_key
from helpers import garbage_left


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shares_at(clock: Clock, lag_s: float = 0.002, floor: float = 0.0, busy: float = 0.0) -> Shares:
    """Shares on `clock`, applying on lateness alone unless `busy` is given."""
    settings = ShareSettings(lag_s=lag_s, window_s=1.0, refresh_s=0.0, floor=floor, busy=busy)
    return Shares(settings, clock)


def late_shares(clock: Clock, floor: float = 0.0) -> Shares:
    """Shares on `clock` whose loop ran 50 ms late on average: they apply."""
    shares = shares_at(clock, floor=floor)
    shares.late(0.05, 1.0)
    return shares


def test_use_is_seconds_per_second_and_decays_over_the_window() -> None:
    clock = Clock()
    shares = shares_at(clock)
    shares.charge("a", 0.3)
    assert shares.use("a") == pytest.approx(0.3)
    clock.now += 1.0
    assert shares.use("a") == pytest.approx(0.3 / math.e)


def test_the_loops_lateness_is_averaged_over_the_window() -> None:
    shares = shares_at(Clock())
    shares.late(0.01, 1.0)
    assert shares.lag_s() == pytest.approx(0.01 * (1 - 1 / math.e))
    shares.late(0.0, 1.0)
    assert shares.lag_s() == pytest.approx(0.01 * (1 - 1 / math.e) / math.e)


def test_nobody_waits_while_the_loop_runs_on_time() -> None:
    clock = Clock()
    shares = shares_at(clock)
    shares.late(0.001, 1.0)  # under the 2 ms setting
    shares.charge("a", 0.9)
    shares.charge("b", 0.01)
    assert shares.fair_share() == math.inf
    assert shares.wait_s("a") == 0


@pytest.mark.parametrize(
    "busy, thread, split",
    [(0.9, 0.95, True), (0.9, 0.8, False), (0.0, 1.0, False)],
    ids=["over busy", "under busy", "busy 0"],
)
def test_an_on_time_loop_is_split_while_its_thread_is_busy_that_much_of_the_time(
    busy: float, thread: float, split: bool
) -> None:
    shares = shares_at(Clock(), busy=busy)
    shares.late(0.0001, 1.0, busy=thread / (1 - 1 / math.e))  # averaged to `thread`
    assert shares.busy() == pytest.approx(thread)
    shares.charge("flood", 0.55)
    shares.charge("honest", 0.01)
    assert shares.fair_share() == (pytest.approx(0.56 / 2) if split else math.inf)
    assert (shares.wait_s("flood") > 0) is split
    assert shares.wait_s("honest") == 0


@pytest.mark.parametrize("thread", [0.95, 0.3])
async def test_the_heartbeat_measures_how_busy_the_loops_thread_is(thread: float) -> None:
    loop = asyncio.get_running_loop()
    # the thread's CPU time, as a thread busy `thread` of the time since the beat began
    settings = ShareSettings(window_s=0.05, beat_s=0.005, refresh_s=0.0)
    shares = Shares(settings, cpu=lambda: loop.time() * thread)
    shares.start()
    for _ in range(40):  # a call in flight at every beat: the heartbeat ticks on
        shares.charge("a", 0.0)
        await asyncio.sleep(0.005)
    assert shares.beats > 10
    assert shares.busy() == pytest.approx(thread, abs=0.1)
    shares.stop()


def test_when_the_loop_runs_late_the_calls_time_is_split_equally() -> None:
    clock = Clock()
    shares = late_shares(clock)
    for key, seconds in (("light-1", 0.02), ("light-2", 0.03), ("hog-1", 0.6), ("hog-2", 0.15)):
        shares.charge(key, seconds)
    assert shares.fair_share() == pytest.approx(0.8 / 4)
    assert shares.wait_s("light-1") == 0
    assert shares.wait_s("hog-1") == pytest.approx(math.log(0.6 / 0.2))
    assert shares.wait_s("hog-2") == 0  # under its split


def test_calls_without_a_valid_credential_get_a_quarter_of_a_clients_split() -> None:
    clock = Clock()
    shares = late_shares(clock)
    shares.charge("credential:agent", 0.2)
    shares.charge(ANONYMOUS, 0.2)
    assert shares.fair_share() == pytest.approx(0.4 / 1.25)  # a client's split
    assert shares.wait_s("credential:agent") == 0
    assert shares.wait_s(ANONYMOUS) == pytest.approx(math.log(0.2 / (0.32 * 0.25)))


@pytest.mark.parametrize(
    "peer, caller, key",
    [
        ("ipv4:10.0.0.7:5000", "agent", "credential:agent"),
        ("ipv4:10.0.0.7:5000", None, "anonymous:ip:10.0.0.7"),
        ("ipv4:127.0.0.1:5000", None, ANONYMOUS),
        ("unix:/run/dsp.sock", None, ANONYMOUS),
    ],
)
def test_with_credentials_a_call_without_one_is_keyed_apart_by_address_as_anonymous(
    peer: str, caller: str | None, key: str
) -> None:
    token = CALLER.set(caller)
    try:
        assert share_key(client_of(peer), anonymous=True) == key
    finally:
        CALLER.reset(token)


@pytest.mark.parametrize(
    "peer, key", [("ipv4:10.0.0.7:5000", "ip:10.0.0.7"), ("ipv4:127.0.0.1:5000", None)]
)
def test_without_credentials_a_client_is_its_address_over_tcp_and_nobody_over_loopback(
    peer: str, key: str | None
) -> None:
    assert share_key(client_of(peer)) == key


def test_a_client_a_little_over_its_share_does_not_wait() -> None:
    clock = Clock()
    shares = late_shares(clock)
    shares.charge("a", 0.12)  # 1.2 times the split of 0.1 (the allowance is 1.25)
    shares.charge("b", 0.08)
    assert shares.fair_share() == pytest.approx(0.1)
    assert shares.wait_s("a") == 0


def test_shares_hold_for_a_window_after_the_loop_last_ran_late() -> None:
    clock = Clock()
    shares = late_shares(clock)
    shares.charge("hog", 0.9)
    shares.charge("light", 0.01)
    shares.late(0.0, 10.0)  # on time again
    clock.now += 0.5
    shares.charge("light", 0.0)
    assert shares.fair_share() < math.inf  # still held: the loop only just caught up
    clock.now += 1.0
    shares.charge("light", 0.0)
    assert shares.fair_share() == math.inf


def test_a_split_is_at_least_half_a_whole_loop_split_equally() -> None:
    clock = Clock()
    shares = late_shares(clock, floor=0.5)  # the host is short of CPU: the loop runs late
    shares.charge("busy", 0.1)  # all a busy client got done, held to the quiet one's use
    shares.charge("quiet", 0.01)
    assert shares.fair_share() == pytest.approx(0.5 / 2)  # not (0.1 + 0.01) / 2
    assert shares.wait_s("busy") == 0


async def test_a_call_waits_for_its_share_at_most_max_wait_s() -> None:
    shares = Shares(ShareSettings(max_wait_s=0.1, floor=0.0, refresh_s=0.0))
    shares.late(1.0, 1.0)
    shares.charge("hog", 100.0)  # far over: the split falls with its rate as it waits
    shares.charge("light", 0.001)
    assert shares.wait_s("hog") > 0.3
    started = time.monotonic()
    await shares.turn("hog")
    assert 0.1 <= time.monotonic() - started < 0.3


async def _let_go_times(shares: Shares, key: str, count: int) -> list[float]:
    """When each of `count` calls of `key`, all waiting at once, was let go."""
    started, times = time.monotonic(), []

    async def call() -> None:
        await shares.turn(key)
        times.append(time.monotonic() - started)

    await asyncio.gather(*(call() for _ in range(count)))
    return times


async def test_each_of_a_clients_waiting_calls_goes_after_max_wait_s_at_most() -> None:
    shares = Shares(ShareSettings(max_wait_s=0.1, floor=0.0, refresh_s=0.0))
    shares.late(1.0, 1.0)
    shares.charge("hog", 100.0)  # over throughout: each of its calls goes only as overdue
    shares.charge("light", 0.001)
    times = await _let_go_times(shares, "hog", 5)
    assert times[0] >= 0.1 and times[-1] < 0.5, times  # not each behind the one before
    assert shares.waiting("hog") == 0


async def _keep_charging(shares: Shares, key: str, seconds: float) -> None:
    """`key` a light client that stays counted among those using the loop."""
    while True:
        shares.charge(key, seconds)
        await asyncio.sleep(0.02)


async def test_a_clients_waiting_calls_go_one_at_a_time_each_within_its_share() -> None:
    settings = ShareSettings(window_s=0.2, floor=0.5, refresh_s=0.0, max_wait_s=10.0)
    shares = Shares(settings)
    shares.late(1.0, 1.0)
    shares.charge("hog", 0.5)  # over until its rate decays under the floor's split (0.25)
    light = asyncio.create_task(_keep_charging(shares, "light", 0.0001))
    within, times, started = [], [], time.monotonic()

    async def call() -> None:
        await shares.turn("hog")
        within.append(shares.use("hog") <= shares.fair_share() * settings.over)
        times.append(time.monotonic() - started)
        shares.charge("hog", 0.02)  # the call's first step, before the next is looked at

    try:
        await asyncio.gather(*(call() for _ in range(6)))
    finally:
        light.cancel()
    assert within == [True] * 6
    assert times[-1] - times[0] > 0.2, times  # each after the one before has decayed


def _hog_over_until_the_split_grows() -> Shares:
    """Shares on the real clock holding "hog" over its split for seconds."""
    shares = Shares(ShareSettings(window_s=1.0, floor=0.0, refresh_s=0.0, max_wait_s=10.0))
    shares.late(1.0, 1.0)
    shares.charge("hog", 2.0)
    shares.charge("light", 0.001)
    return shares


async def test_a_call_that_comes_while_others_wait_goes_after_them() -> None:
    shares = _hog_over_until_the_split_grows()
    order: list[str] = []

    async def call(name: str) -> None:
        await shares.turn("hog")
        order.append(name)

    first = asyncio.create_task(call("first"))
    await asyncio.sleep(0.01)
    assert shares.waiting("hog") == 1
    shares.charge("light", 10.0)  # the split grows: the hog is within its share again
    await asyncio.wait_for(asyncio.gather(first, call("later")), 1.0)
    assert order == ["first", "later"]


def _held_hog(clock: Clock) -> Shares:
    """Shares on a still `clock` (nothing decays) holding "hog" far over its split."""
    settings = ShareSettings(window_s=10.0, floor=0.0, refresh_s=5.0, max_wait_s=100.0)
    shares = Shares(settings, clock)
    shares.late(1.0, 1.0)
    shares.charge("light", 0.001)
    clock.now += settings.refresh_s
    shares.charge("hog", 100.0)
    return shares


async def test_a_drained_sidecars_shares_let_every_waiting_call_go_at_once() -> None:
    shares = _held_hog(Clock())  # the waits end only by stop()
    waiting = [asyncio.create_task(shares.turn("hog")) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert shares.waiting("hog") == 3
    shares.stop()
    await asyncio.wait_for(asyncio.gather(*waiting), 1.0)  # not at the next look, 5 s on
    assert shares.waiting("hog") == 0 and shares.wait_s("hog") == 0


async def test_a_reload_of_the_shares_settings_lets_no_waiting_call_go() -> None:
    shares = _held_hog(Clock())
    shares.start()
    waiting = [asyncio.create_task(shares.turn("hog")) for _ in range(3)]
    await asyncio.sleep(0.01)
    shares.reconfigure(dataclasses.replace(shares.settings, lag_s=0.01))
    await asyncio.sleep(0.05)
    assert shares.running and shares.settings.lag_s == 0.01
    assert shares.waiting("hog") == 3  # a reload is no drain
    shares.stop()
    await asyncio.wait_for(asyncio.gather(*waiting), 1.0)


async def test_a_call_cancelled_while_it_waits_leaves_its_clients_line() -> None:
    shares = Shares(ShareSettings(max_wait_s=0.1, floor=0.0, refresh_s=0.0))
    shares.late(1.0, 1.0)
    shares.charge("hog", 100.0)
    shares.charge("light", 0.001)
    first = asyncio.create_task(shares.turn("hog"))
    second = asyncio.create_task(shares.turn("hog"))
    await asyncio.sleep(0.01)
    assert shares.waiting("hog") == 2
    first.cancel()
    await asyncio.wait_for(second, 1.0)
    assert first.cancelled() and shares.waiting("hog") == 0


def test_the_split_is_among_the_clients_charged_within_the_window() -> None:
    clock = Clock()
    shares = late_shares(clock)
    for gone in range(20):  # connections that closed a moment ago, their use still decaying
        shares.charge(f"gone-{gone}", 0.05)
    clock.now += 1.5
    shares.charge("a", 0.3)
    shares.charge("b", 0.3)
    total = 0.6 + 20 * 0.05 * math.exp(-1.5)
    assert shares.fair_share() == pytest.approx(total / 2)  # not total / 22
    assert shares.wait_s("a") == 0


def test_idle_clients_are_forgotten() -> None:
    clock = Clock()
    shares = late_shares(clock)
    shares.charge("a", 0.001)
    clock.now += 30
    shares.charge("b", 0.1)
    assert shares.use("a") == 0
    assert shares.fair_share() == math.inf  # one client left: nobody to be fair to


async def test_a_metered_call_counts_its_steps_not_its_waits() -> None:
    shares = Shares()

    async def work() -> str:
        _busy(0.02)
        await asyncio.sleep(0.3)
        _busy(0.02)
        return "done"

    started = time.perf_counter()
    assert await shares.metered("a", work()) == "done"
    assert time.perf_counter() - started >= 0.3
    charged = shares.use("a") * shares.settings.window_s  # decayed a little since
    assert 0.02 < charged < 0.3


async def test_a_metered_call_cancelled_while_it_waits_is_cancelled_inside() -> None:
    shares = Shares()
    cleaned = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.set()

    task = asyncio.create_task(shares.metered("a", work()))
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled() and cleaned.is_set()


class _Held:
    """What a call's frame holds (a stream's state, the last assembly)."""


async def test_a_metered_call_that_ends_on_its_cancel_leaves_no_cycle_for_the_collector() -> None:
    async def work(held: _Held) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # as a stream ends on its cancel
            await asyncio.sleep(10)

    async def cancelled() -> None:
        task = asyncio.create_task(Shares().metered("a", work(_Held())))
        await asyncio.sleep(0)
        task.cancel()  # as a client's cancel of its stream
        await task

    assert not [thing for thing in await garbage_left(cancelled) if isinstance(thing, _Held)]


def _busy(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        json.dumps(list(range(100)))


def test_a_starting_call_counts_each_running_call_at_what_its_clients_calls_cost_lately() -> None:
    clock = Clock()
    shares = late_shares(clock)
    for _ in range(4):  # four calls ended, 0.1 s of the loop each
        with shares.running_call("hog"):
            shares.charge("hog", 0.1)
    shares.charge("light", 0.6)
    assert shares.wait_s("hog") == 0 and shares.wait_s("hog", starting=True) == 0
    with shares.running_call("hog"), shares.running_call("hog"), shares.running_call("hog"):
        assert shares.running_calls("hog") == 3
        assert shares.wait_s("hog") == 0  # a write of a running call: its use alone
        # 0.4 and 3 x 0.1 is more than 1.25 times its split of 1.0, 0.5
        assert shares.wait_s("hog", starting=True) == pytest.approx(math.log(0.7 / 0.5))
    assert shares.running_calls("hog") == 0


def test_a_client_that_ended_no_call_has_its_running_calls_counted_at_its_use() -> None:
    shares = late_shares(Clock())
    with shares.running_call("hog"):
        shares.charge("hog", 0.3)
        shares.charge("light", 0.6)
        # no call ended: one a window at least, so the running one costs 0.3 too
        assert shares.wait_s("hog", starting=True) == pytest.approx(math.log(0.6 / 0.45))


async def test_a_running_calls_writes_go_before_its_clients_new_calls() -> None:
    shares = _hog_over_until_the_split_grows()
    order: list[str] = []

    async def call(name: str, starting: bool) -> None:
        await shares.turn("hog", starting=starting)
        order.append(name)

    new = asyncio.create_task(call("new call", True))
    await asyncio.sleep(0.01)
    write = asyncio.create_task(call("write", False))
    await asyncio.sleep(0.01)
    assert shares.waiting("hog") == 2
    shares.charge("light", 10.0)  # the split grows: the hog is within its share again
    await asyncio.wait_for(asyncio.gather(new, write), 1.0)
    assert order == ["write", "new call"]


async def test_a_new_call_overdue_goes_while_running_calls_writes_still_wait() -> None:
    shares = Shares(ShareSettings(max_wait_s=0.1, floor=0.0, refresh_s=0.0))
    shares.late(1.0, 1.0)
    shares.charge("hog", 100.0)  # over throughout: its calls go only as overdue
    shares.charge("light", 0.001)
    new = asyncio.create_task(shares.turn("hog", starting=True))
    await asyncio.sleep(0.05)
    write = asyncio.create_task(shares.turn("hog"))
    await asyncio.wait_for(new, 1.0)
    assert not write.done()  # its own max_wait_s is not up
    await asyncio.wait_for(write, 1.0)
