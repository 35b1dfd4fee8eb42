"""The admin page: what 16 live views over a large registry cost the other callers."""

from __future__ import annotations

import asyncio
import functools
import socket

import dsh_system_prompt as dsp

from .. import procs
from ..report import Figure
from ..stats import Operation, Samples, Stopwatch
from ..targets import TARGETS
from .build import slowdown
from .harness import Harness, Probe, beside_a_process


async def admin_live_views(h: Harness) -> list[Figure]:
    """Assemble p50 of another caller with 16 live admin views open over 10,000
    registrations, a change every 50 ms, over the same with no view open."""
    scopes, per_scope, views, count = 100, 100, 16, h.budget.n(400)
    port = _free_port()
    sidecar = await procs.start_sidecar(
        config={
            "admin_listen": f"127.0.0.1:{port}",
            "limits": {"max_registrations_per_session": 20_000},
        },
        label="sidecar-admin-views",
    )
    try:
        async with dsp.connect(sidecar.address, client_name="bench-admin-load") as loader:
            for index in range(scopes):
                scope = await loader.scope(f"scope-{index}")
                for part in range(per_scope):
                    await scope.section(f"s-{part}", part, f"Section {part} of scope {index}.")
            churn = asyncio.create_task(_churn(loader))
            probe = Probe.open(sidecar.address)
            try:
                timed = functools.partial(_timed, probe.assemble("scope-1"), count)
                calm, viewed = await beside_a_process(
                    timed,
                    functools.partial(procs.start_admin_views, f"http://127.0.0.1:{port}", views),
                )
                calm_after = await timed()
            finally:
                churn.cancel()
                await probe.close()
    finally:
        await sidecar.stop()
    details = {
        "calm_before": calm.summary_us(),
        "with_views": viewed.summary_us(),
        "calm_after": calm_after.summary_us(),
        "registrations": scopes * per_scope,
        "views": "8 Scopes and 8 Prompt views (scope-N), read by a process of their "
        "own from 4 loopback addresses; a section updated every 50 ms throughout",
    }
    name = "Assemble p50, 16 live admin views over 10,000 registrations / none"
    baseline = (calm.p50 + calm_after.p50) / 2
    return [
        slowdown(
            "admin_live_views", name, viewed.p50, baseline, TARGETS["admin_live_views"], details
        )
    ]


async def _churn(client: dsp.Client) -> None:
    """A change every 50 ms: the live views have something to show."""
    handle = await (await client.scope("scope-0")).section("churn", 0, "churn 0")
    index = 0
    while True:
        index += 1
        await handle.update(f"churn {index}")
        await asyncio.sleep(0.05)


async def _timed(operation: Operation, count: int) -> Samples:
    stopwatch = Stopwatch()
    for _ in range(count):
        await stopwatch.timed(operation)
        await asyncio.sleep(0.005)  # a caller among others, not a flood
    return stopwatch.samples()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
