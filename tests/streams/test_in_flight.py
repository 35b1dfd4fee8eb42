"""The prompts in flight serve their waiters in the order they came (strict FIFO with
head-of-line blocking), within each client's share: a release gives what it freed to the
earliest waiter that fits, so no waiter is overtaken forever by later ones. Checked on
InFlight itself with real asyncio tasks; tests/hostile/test_hostile_watchers.py drives the same
bound through a sidecar's WatchPrompt streams."""

from __future__ import annotations

import asyncio
import contextlib

from dsh_system_prompt_server.rpc.streams.in_flight import InFlight

BOUND = 400  # a share is 100


async def settle() -> None:
    """Let every task that can run run until it waits again."""
    for _ in range(10):
        await asyncio.sleep(0)


class Held:
    """Reservations, each in a task of its own, held until released; `log` names each
    when it is granted, in the order they are."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight
        self.log: list[str] = []
        self._release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def take(self, name: str, size: int, client: str | None = None) -> None:
        self._release[name] = asyncio.Event()
        self.tasks[name] = asyncio.create_task(self._hold(name, size, client))
        await settle()

    async def release(self, name: str) -> None:
        self._release[name].set()
        await settle()

    async def release_all(self) -> None:
        for event in self._release.values():
            event.set()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    async def _hold(self, name: str, size: int, client: str | None) -> None:
        async with self.in_flight.reserved(size, client):
            self.log.append(name)
            await self._release[name].wait()


async def filled(held: Held, *sizes: int) -> None:
    """Fill the bound with reservations no client's share limits."""
    for index, size in enumerate(sizes):
        await held.take(f"h{index}", size)
    assert held.in_flight.bytes == BOUND and held.in_flight.waiting() == 0


async def test_waiters_are_served_in_the_order_they_came() -> None:
    held = Held(InFlight(BOUND))
    await filled(held, 100, 100, 100, 50, 50)
    await held.take("a", 100, "a")
    await held.take("b", 10, "b")
    await held.take("c", 10, "c")
    await held.release("h3")  # 50 free: b and c would fit, but a came first
    assert held.log[5:] == [] and held.in_flight.waiting() == 3
    await held.release("h4")
    await held.release("h0")
    assert held.log[5:] == ["a", "b", "c"]
    await held.release_all()
    assert held.in_flight.bytes == 0


async def test_a_large_waiter_is_not_starved_by_a_stream_of_small_later_ones() -> None:
    in_flight = InFlight(BOUND)
    log: list[str] = []

    async def small(client: str) -> None:
        for _ in range(20):
            async with in_flight.reserved(10, client):
                log.append("small")
                await asyncio.sleep(0)

    workers = [asyncio.create_task(small(f"s{index}")) for index in range(40)]  # the bound
    await settle()
    arrived = len(log)

    async def large() -> None:
        async with in_flight.reserved(100, "large"):
            log.append("large")

    await asyncio.gather(large(), *workers)
    # each small worker goes at most once before it (it was held or ahead), then queues
    # behind it: without the order it waited until 10 workers had done their 20 rounds
    assert log.index("large") - arrived <= len(workers)
    assert log.count("small") == 40 * 20 and in_flight.bytes == 0


async def test_a_waiter_held_back_by_its_clients_share_holds_up_no_other_client() -> None:
    held = Held(InFlight(BOUND))
    await held.take("hog", 100, "hog")  # its share, stalled
    await held.take("hog again", 10, "hog")
    await held.take("other", 50, "other")
    assert held.log == ["hog", "other"] and held.in_flight.waiting() == 1
    await held.release("hog")
    assert held.log == ["hog", "other", "hog again"]
    await held.release_all()


async def test_a_clients_later_small_messages_wait_behind_its_earlier_large_one() -> None:
    held = Held(InFlight(BOUND))
    await held.take("first", 60, "client")
    await held.take("large", 300, "client")  # more than a share: alone among its client's
    await held.take("small", 10, "client")  # fits beside "first", but "large" came first
    assert held.log == ["first"] and held.in_flight.waiting() == 2
    await held.release("first")
    assert held.log == ["first", "large"]
    await held.release("large")
    assert held.log == ["first", "large", "small"]
    await held.release_all()


async def test_a_waiter_that_gives_up_at_the_head_lets_the_ones_behind_it_go() -> None:
    held = Held(InFlight(BOUND))
    await filled(held, 100, 100, 100, 50, 50)
    await held.release("h4")
    await held.take("large", 100, "large")  # 50 free: it waits, and so does what follows
    await held.take("small", 10, "small")
    assert held.log[5:] == []
    held.tasks["large"].cancel()
    await settle()
    assert held.log[5:] == ["small"] and held.in_flight.waiting() == 0
    await held.release_all()
    assert held.in_flight.bytes == 0


async def test_a_waiter_cancelled_once_served_gives_its_bytes_back() -> None:
    in_flight = InFlight(BOUND)
    held = Held(in_flight)
    for index in range(3):
        await held.take(f"h{index}", 100)
    async with in_flight.reserved(100):  # the last of the bound, given back right here
        await held.take("served", 100, "served")
        assert in_flight.waiting() == 1
    # the release above reserved its bytes for "served" and woke it: cancelled before it ran
    held.tasks["served"].cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await held.tasks["served"]
    assert held.log == ["h0", "h1", "h2"] and in_flight.bytes == 300
    await held.take("next", 100, "next")
    assert held.log[-1] == "next"
    await held.release_all()
    assert in_flight.bytes == 0
