"""Each client's share of the event loop (issue 22): when the loop runs later than
`fair_share.lag_s`, the time the clients' calls take is split equally among them, and a
client more than 1.25 times over its split waits before its next call or watch write;
the others go on at once.

A client is what the quotas count: here each side presents a credential of its own.
These tests drive a real sidecar; the arithmetic of shares (decay, the split) is checked
on its own with a clock the test moves (test_shares.py), and what each call costs its
client in test_share_costs.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_server import load_config
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import SidecarFactory, eventually, metric, next_events

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
    sidecar = await make_sidecar(fair_share={"lag_s": LAG_S}, **credentials(tmp_path))
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
    free = await make_sidecar(fair_share={"lag_s": 0, "busy": 0}, **credentials(tmp_path / "free"))
    served = {}
    for name, sidecar in (("held", held), ("free", free)):
        lights = (light(sidecar.address, 2.0, key) for key in ("light", "light-2", "light-3"))
        served[name], *_ = await asyncio.gather(hog(sidecar.address, 2.0), *lights)
    # held, each of its four lanes waits for the hog's rate to fall back to an equal split
    # of four clients' time (which the light ones hardly use)
    assert served["held"] < served["free"] / 3, served


async def test_nobody_waits_when_the_fair_share_lag_and_busy_are_0(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(fair_share={"lag_s": 0, "busy": 0}, **credentials(tmp_path))
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
    return metric(sidecar, name)


async def test_a_reload_changes_the_fair_share_keys_live(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("[fair_share]\nlag_s = 0.002\n")
    sidecar = await make_sidecar(fair_share={"lag_s": 0.002})
    reloader = Reloader(sidecar, str(config), lambda: load_config(config))
    config.write_text("[fair_share]\nlag_s = 0.01\nover = 2\nfloor = 0.25\nmax_wait_s = 5\n")
    reloaded = reloader.reload("test")
    assert reloaded is not None
    assert reloaded.applied == [
        "fair_share.lag_s",
        "fair_share.over",
        "fair_share.floor",
        "fair_share.max_wait_s",
    ]
    settings = sidecar.state.shares.settings
    assert (settings.lag_s, settings.over, settings.floor, settings.max_wait_s) == (
        0.01,
        2.0,
        0.25,
        5.0,
    )


async def test_a_drained_sidecar_stops_measuring_its_loop(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar()
    assert sidecar.state.shares.running
    await sidecar.drain()
    assert not sidecar.state.shares.running


async def test_over_loopback_without_credentials_nobody_is_held(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(fair_share={"lag_s": LAG_S})
    sidecar.state.shares.settings = dataclasses.replace(sidecar.state.shares.settings, floor=0)

    async def loop(seconds: float) -> None:
        async with dsp.connect(sidecar.address) as client:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                await client.assemble(fields={"pad": "p" * FIELDS_PAD}, timeout=30)

    await asyncio.gather(*(loop(1.0) for _ in range(4)))  # connections, not clients
    assert _metric(sidecar, "dsp_share_waits_total") == 0


async def test_a_clients_new_call_waits_for_what_its_running_calls_will_cost(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sharing_sidecar(make_sidecar, tmp_path)
    shares = sidecar.state.shares
    answer = asyncio.Event()

    async def held(ctx: dsp.AssembleContext) -> str:
        await answer.wait()
        return "late"

    async with (
        dsp.connect(sidecar.address, token=TOKENS["hog"]) as hog_client,
        dsp.connect(sidecar.address, token=TOKENS["light"]) as light_client,
    ):
        await light_client.assemble(scope="light", timeout=30)
        scope = await hog_client.scope("hog")
        await scope.section("held", 1, held)
        running = [
            asyncio.create_task(hog_client.assemble(scope="hog", timeout=30)) for _ in range(3)
        ]
        await eventually(lambda: shares.running_calls(HOG) == 3, "three running calls")
        shares.late(1.0, 1.0)  # as if the loop had run a second late
        shares.charge(LIGHT, 1.0)
        shares.charge(HOG, 1.5)  # within 1.25 times its split by its use alone (of 2.5)
        await asyncio.sleep(shares.settings.refresh_s)  # the split is of both
        assert shares.wait_s(HOG) == 0
        new = asyncio.create_task(hog_client.assemble(scope="light", timeout=30))
        # but its three running calls are expected to cost what its calls cost lately
        await eventually(lambda: shares.waiting(HOG) == 1, "the new call waiting")
        answer.set()
        await asyncio.wait_for(asyncio.gather(*running, new), 10)
        assert shares.running_calls(HOG) == 0
