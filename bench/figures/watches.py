"""Change streams: fan-out to many watchers, and what idle watchers cost a registration."""

from __future__ import annotations

import asyncio
import functools
import time

import dsh_system_prompt as dsp

from .. import procs
from ..report import Figure, Judged
from ..stats import Samples, Stopwatch
from ..targets import TARGETS
from .build import figure, slowdown
from .harness import Harness, beside_a_process


async def change_fan_out(h: Harness) -> list[Figure]:
    """100 watchers, 1,000 registrations: all delivered? and how fast."""
    watchers, registrations, per_client = 100, 1000, 10
    sidecar = await procs.start_sidecar(label="sidecar-fan-out")
    clients: list[dsp.Client] = []
    streams: list[dsp.ChangeStream] = []
    sent: dict[str, int] = {}
    try:
        for i in range(watchers // per_client):
            clients.append(await dsp.connect(sidecar.address, client_name=f"bench-watch-{i}"))
        streams = [await clients[i // per_client].watch_changes() for i in range(watchers)]
        registrar = await dsp.connect(sidecar.address, client_name="bench-registrar")
        clients.append(registrar)
        watching = [
            asyncio.create_task(_watch(stream, registrations, "fan-")) for stream in streams
        ]
        started = time.perf_counter()
        for i in range(registrations):
            name = f"fan-{i:04d}"
            sent[name] = time.perf_counter_ns()
            await registrar.section(name, i, "Fan-out section.")
        registered_s = time.perf_counter() - started
        done, pending = await asyncio.wait(watching, timeout=60)
        for task in pending:
            task.cancel()
        delivered_s = time.perf_counter() - started
        results = [task.result() for task in done]
    finally:
        for stream in streams:
            await stream.close()
        for client in clients:
            await client.close()
        await sidecar.stop()
    latencies = Samples.of(
        [at - sent[name] for received, _ in results for name, at in received.items()]
    )
    delivered = sum(len(received) for received, _ in results)
    missed = sum(missed for _, missed in results)
    expected = watchers * registrations
    p50_ms, p99_ms = latencies.p50 / 1e6, latencies.p99 / 1e6
    details = {
        "delivered": delivered,
        "expected": expected,
        "missed_reported": missed,
        "latency_p50_ms": round(p50_ms, 2),
        "latency_p99_ms": round(p99_ms, 2),
        "registrations_s": round(registered_s, 2),
        "all_delivered_s": round(delivered_s, 2),
        "latency": "from the start of the RegisterSection call to the watcher "
        "reading the event; the 100 watchers run in the bench process (10 "
        "sessions, 10 streams each), so reading 100,000 events competes with "
        "registering",
    }
    shown = f"{delivered:,}/{expected:,} delivered, p50 {p50_ms:.1f} ms, p99 {p99_ms:.1f} ms"
    judged: Judged = {"target": "all delivered", "met": delivered == expected}
    name = "change fan-out, 100 watchers, 1,000 registrations"
    return [
        figure("change_fan_out", name, p50_ms, "ms p50 delivery", judged, details, display=shown)
    ]


async def idle_watchers(h: Harness) -> list[Figure]:
    """Registration p50 with 1,000 idle watchers, over the same with none."""
    count, registrations = 1000, h.budget.n(500)
    sidecar = await procs.start_sidecar(label="sidecar-idle-watchers")
    try:
        async with dsp.connect(sidecar.address, client_name="bench-registrar") as registrar:
            alone, watched = await beside_a_process(
                functools.partial(_registration_samples, registrar, registrations),
                functools.partial(procs.start_watchers, sidecar.address, count),
            )
    finally:
        await sidecar.stop()
    details = {
        "without_watchers": alone.summary_us(),
        "with_watchers": watched.summary_us(),
        "watchers": count,
        "measured": "a section registered then disposed (two changes, each fanned "
        "out to every watcher); the watchers read in a process of their own",
    }
    name = "registration p50, 1,000 idle watchers / none"
    return [
        slowdown("idle_watchers", name, watched.p50, alone.p50, TARGETS["idle_watchers"], details)
    ]


async def _registration_samples(client: dsp.Client, count: int) -> Samples:
    stopwatch = Stopwatch()
    for index in range(count):
        register = functools.partial(
            client.section, f"idle-{index}", index, "Registered under watch."
        )
        dispose = await stopwatch.timed(register)
        await dispose()
    return stopwatch.samples()


async def _watch(
    stream: dsp.ChangeStream, expected: int, prefix: str
) -> tuple[dict[str, int], int]:
    received: dict[str, int] = {}
    missed = 0
    async for item in stream:
        now = time.perf_counter_ns()
        if isinstance(item, dsp.ChangesMissed):
            missed += item.count
        elif isinstance(item, dsp.ChangesResynced):  # behind: its snapshot stands for the events
            missed += sum(
                1
                for info in item.snapshot.registrations
                if info.name.startswith(prefix) and info.name not in received
            )
        elif item.action == "registered" and item.name.startswith(prefix):
            received[item.name] = now
        if len(received) + missed >= expected:
            break
    return received, missed
