"""Each client's share of the event loop (issue 22): when the loop runs later than
`fair_share_lag_s`, the time the clients' calls take is split equally among them, and a
client more than 1.25 times over its split waits before its next call or watch write;
the others go on at once.

A client is what the quotas count: here each side presents a credential of its own.
The sidecar-level tests drive a real sidecar; the arithmetic of shares (decay,
the split) is checked on its own with a clock the test moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import load_config
from dsh_system_prompt_server.guard.shares import (
    CALL_S,
    MESSAGE_S,
    Shares,
    ShareSettings,
    wire_s,
)
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import SidecarFactory, next_events

TOKENS = {
    "hog": "hog-token-0123456789",
    "light": "light-token-0123456789",
    "light-2": "light-2-token-0123456789",
    "light-3": "light-3-token-0123456789",
}
HOG, LIGHT = "credential:hog", "credential:light"
FIELDS_PAD = 60 * 1024  # under max_fields_bytes: each call parses this much JSON
LAG_S = 0.00001  # any lateness at all: shares hold throughout (the hog keeps the loop late)


def credentials(folder: Path) -> dict[str, Any]:
    folder.mkdir(exist_ok=True)
    entries = []
    for name, token in TOKENS.items():
        path = folder / f"{name}.token"
        path.write_text(token + "\n")
        entry = {"name": name, "role": "agent", "scopes": ["*"], "token_file": str(path)}
        entries.append({**entry, "global": True})  # the writer registers global sections
    return {"credentials": entries}


async def sharing_sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Any:
    """A sidecar whose shares hold whenever the loop is late at all, with no floor: the
    test's in-process clients are too light for the real floor (half a loop split equally,
    tested on its own on a moved clock) to hold anyone."""
    sidecar = await make_sidecar(fair_share_lag_s=LAG_S, **credentials(tmp_path))
    shares = sidecar.state.shares
    shares.settings = dataclasses.replace(shares.settings, floor=0.0)
    return sidecar


async def hog(address: str, seconds: float) -> int:
    """Four calls at a time, each with new large fields (never answered from a cache)."""
    calls = 0
    async with dsp.connect(address, token=TOKENS["hog"]) as client:
        until = time.monotonic() + seconds

        async def loop(lane: int) -> None:
            nonlocal calls
            while time.monotonic() < until:
                calls += 1
                fields = {"lane": lane, "n": calls, "pad": "p" * FIELDS_PAD}
                await client.assemble(scope="hog", fields=fields, timeout=30)

        await asyncio.gather(*(loop(lane) for lane in range(4)))
    return calls


async def light(address: str, seconds: float, name: str = "light") -> int:
    """One small call now and then."""
    calls = 0
    async with dsp.connect(address, token=TOKENS[name]) as client:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await client.assemble(scope="light", timeout=30)
            calls += 1
            await asyncio.sleep(0.1)
    return calls


async def test_a_client_over_its_fair_share_of_a_busy_loop_waits_and_a_light_one_does_not(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sharing_sidecar(make_sidecar, tmp_path)
    shares = sidecar.state.shares
    served, lit = await asyncio.gather(hog(sidecar.address, 2.0), light(sidecar.address, 2.0))
    assert served > 0 and lit > 0
    assert shares.waits_of(HOG) > 0
    assert shares.waits_of(LIGHT) == 0
    assert _metric(sidecar, "dsp_share_waits_total") >= shares.waits_of(HOG)


async def test_a_client_held_to_its_share_gets_fewer_calls_through(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    held = await sharing_sidecar(make_sidecar, tmp_path / "held")
    free = await make_sidecar(fair_share_lag_s=0, **credentials(tmp_path / "free"))
    served = {}
    for name, sidecar in (("held", held), ("free", free)):
        lights = (light(sidecar.address, 2.0, key) for key in ("light", "light-2", "light-3"))
        served[name], *_ = await asyncio.gather(hog(sidecar.address, 2.0), *lights)
    # held, each of its four lanes waits for the hog's rate to fall back to an equal split
    # of four clients' time (which the light ones hardly use)
    assert served["held"] < served["free"] / 3, served


async def test_nobody_waits_when_fair_share_lag_s_is_0(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(fair_share_lag_s=0, **credentials(tmp_path))
    await asyncio.gather(hog(sidecar.address, 1.0), light(sidecar.address, 1.0))
    assert sidecar.state.shares.waits_of(HOG) == 0
    assert _metric(sidecar, "dsp_share_waits_total") == 0


async def test_a_lone_client_never_waits_however_busy(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sharing_sidecar(make_sidecar, tmp_path)
    assert await hog(sidecar.address, 1.0) > 0
    assert sidecar.state.shares.waits_of(HOG) == 0


async def test_a_change_watcher_over_its_share_still_gets_every_change(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sharing_sidecar(make_sidecar, tmp_path)
    async with dsp.connect(sidecar.address, token=TOKENS["hog"]) as watcher:
        changes = await watcher.watch_changes(kinds=["section"])
        shares = sidecar.state.shares
        shares.late(1.0, 1.0)  # as if the loop had run a second late
        shares.charge(HOG, 10.0)  # the watcher's client is far over any share
        shares.charge(LIGHT, 0.5)
        async with dsp.connect(sidecar.address, token=TOKENS["light"]) as writer:
            for index in range(200):
                await writer.section(f"burst-{index}", index, "text")
        seen = [(event.action, event.name) for event in await next_events(changes, 200)]
        assert seen == [("registered", f"burst-{index}") for index in range(200)]
        assert shares.waits_of(HOG) > 0


def _metric(sidecar: Any, name: str) -> float:
    value = sidecar.metrics.registry.get_sample_value(name)
    return 0.0 if value is None else float(value)


# -- the arithmetic ---------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def shares_at(clock: Clock, lag_s: float = 0.002, floor: float = 0.0) -> Shares:
    settings = ShareSettings(lag_s=lag_s, window_s=1.0, refresh_s=0.0, floor=floor)
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


def test_when_the_loop_runs_late_the_calls_time_is_split_equally() -> None:
    clock = Clock()
    shares = late_shares(clock)
    for key, seconds in (("light-1", 0.02), ("light-2", 0.03), ("hog-1", 0.6), ("hog-2", 0.15)):
        shares.charge(key, seconds)
    assert shares.fair_share() == pytest.approx(0.8 / 4)
    assert shares.wait_s("light-1") == 0
    assert shares.wait_s("hog-1") == pytest.approx(math.log(0.6 / 0.2))
    assert shares.wait_s("hog-2") == 0  # under its split


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


async def test_a_call_that_comes_while_others_wait_goes_after_them() -> None:
    shares = Shares(ShareSettings(window_s=1.0, floor=0.0, refresh_s=0.0, max_wait_s=10.0))
    shares.late(1.0, 1.0)
    shares.charge("hog", 2.0)
    shares.charge("light", 0.001)
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


def _busy(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        json.dumps(list(range(100)))


async def test_a_reload_changes_fair_share_lag_s_live(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("fair_share_lag_s = 0.002\n")
    sidecar = await make_sidecar(fair_share_lag_s=0.002)
    reloader = Reloader(sidecar, str(config), lambda: load_config(config))
    config.write_text("fair_share_lag_s = 0.01\n")
    reloaded = reloader.reload("test")
    assert reloaded is not None and "fair_share_lag_s" in reloaded.applied
    assert sidecar.state.shares.settings.lag_s == 0.01


async def test_a_request_refused_for_its_size_costs_its_client_its_bytes(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(**credentials(tmp_path))
    request = pb.AssembleRequest(context=pb.AssembleContext(fields_json="x" * (3 << 20)))
    metadata = (("authorization", f"Bearer {TOKENS['hog']}"),)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Assemble(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    shares = sidecar.state.shares
    # gRPC's work for the 15 MiB received, though the servicer refused each by its size
    assert shares.use(HOG) * shares.settings.window_s > 0.5 * wire_s(5 * request.ByteSize())


async def counting_sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Any:
    """A sidecar with credentials whose shares forget nothing within the test."""
    sidecar = await make_sidecar(**credentials(tmp_path))
    shares = sidecar.state.shares
    shares.settings = dataclasses.replace(shares.settings, window_s=1000.0, idle=0.0)
    return sidecar


def charged_s(sidecar: Any, key: str) -> float:
    shares = sidecar.state.shares
    return float(shares.use(key) * shares.settings.window_s)


async def test_each_call_costs_its_client_grpcs_work_for_it_however_little_its_steps_take(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    async with dsp.connect(sidecar.address, token=TOKENS["hog"]) as client:
        before = charged_s(sidecar, HOG)
        for _ in range(100):  # answered from the response cache: steps of microseconds
            await client.assemble()
    assert charged_s(sidecar, HOG) - before >= 0.9 * 100 * CALL_S


async def test_each_message_a_stream_reads_costs_its_client_grpcs_work_for_it(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    metadata = (("authorization", f"Bearer {TOKENS['hog']}"),)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session = stub.OpenSession(metadata=metadata)
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="s")))
        await session.read()
        before = charged_s(sidecar, HOG)
        for index in range(100):  # read by the sidecar and answered with nothing
            invalidate = pb.CacheInvalidate(invalidate_id=index + 1)
            await session.write(pb.OpenSessionRequest(invalidate=invalidate))
        await session.done_writing()  # the session ends once the sidecar read them all
        while await session.read() is not grpc.aio.EOF:
            pass
    assert charged_s(sidecar, HOG) - before >= 0.9 * 100 * MESSAGE_S


async def test_a_prompt_watchers_first_prompt_costs_its_client_its_bytes(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    parts = ["abcdefghijklmn"[index] * 250_000 for index in range(14)]  # 3.5 MB
    async with (
        dsp.connect(sidecar.address, token=TOKENS["light"]) as writer,
        dsp.connect(sidecar.address, token=TOKENS["hog"]) as watcher,
    ):
        for index, text in enumerate(parts):
            await writer.section(f"large-{index}", 5 + index, text)
        built = await writer.watch_prompt()  # the scope's prompt, built once for both
        await asyncio.wait_for(anext(built), 10)
        before = charged_s(sidecar, HOG)
        prompts = await watcher.watch_prompt()
        first = await asyncio.wait_for(anext(prompts), 10)
        assert first.assembly is not None and first.assembly.sections[-1].text == parts[-1]
        assert charged_s(sidecar, HOG) - before >= wire_s(sum(map(len, parts)))


async def test_a_drained_sidecar_stops_measuring_its_loop(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar()
    assert sidecar.state.shares.running
    await sidecar.drain()
    assert not sidecar.state.shares.running


async def test_over_loopback_without_credentials_nobody_is_held(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(fair_share_lag_s=LAG_S)
    sidecar.state.shares.settings = dataclasses.replace(sidecar.state.shares.settings, floor=0)

    async def loop(seconds: float) -> None:
        async with dsp.connect(sidecar.address) as client:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                await client.assemble(fields={"pad": "p" * FIELDS_PAD}, timeout=30)

    await asyncio.gather(*(loop(1.0) for _ in range(4)))  # connections, not clients
    assert _metric(sidecar, "dsp_share_waits_total") == 0
