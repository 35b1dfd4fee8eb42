"""Change streams: fan-out to many watchers, what idle watchers cost a registration, and a
batching watcher beside many plain ones that cannot keep up."""

from __future__ import annotations

import array
import asyncio
import bisect
import functools
import itertools
import json
import tempfile
import time
from pathlib import Path

import dsh_system_prompt as dsp
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from .. import procs, watchers
from ..attacks import BIG_PART, OWN_CONNECTION
from ..report import Figure, Judged, at_most
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


async def beside_plain_watchers(h: Harness) -> list[Figure]:
    """A batching watcher beside 900 plain ones (15 connections of 60) through a burst of
    1,500 registrations: does it see every one, how late; and is every plain watcher
    either up to date or told it missed events (ChangesMissed), and how soon."""
    plain, per_channel, senders, registrations = 900, 60, 10, 1500
    window_s, after_burst_s = 60.0, 15.0
    sidecar = await procs.start_sidecar(label="sidecar-beside-plain")
    notes = Path(tempfile.mkdtemp(prefix="dsp-bench-plain-")) / "told.bin"
    clients: list[dsp.Client] = []
    stream: dsp.ChangeStream | None = None
    sent: dict[str, int] = {}
    calls: list[int] = []  # each registration's call, start to answer
    try:
        watching = await procs.start_plain_watchers(
            sidecar.address, plain, per_channel, registrations, notes, window_s
        )
        try:
            clients = [
                await dsp.connect(sidecar.address, client_name=f"bench-burst-{index}")
                for index in range(senders + 1)
            ]
            stream = await clients[-1].watch_changes()  # change-batches, as the clients ask
            seen: dict[str, tuple[int, int]] = {}  # name -> (revision, when read)
            missed: list[int] = []
            batched = asyncio.create_task(_watch_all(stream, registrations, seen, missed))

            async def send(client: dsp.Client, first: int) -> None:
                for index in range(first, registrations, senders):
                    name = f"burst-{index:04d}"
                    sent[name] = time.perf_counter_ns()
                    await client.section(name, index, "A burst of registrations.")
                    calls.append(time.perf_counter_ns() - sent[name])

            started = time.perf_counter()
            await asyncio.gather(*(send(clients[i], i) for i in range(senders)))
            burst_s = time.perf_counter() - started
            await asyncio.wait([batched], timeout=after_burst_s)
            batched.cancel()
            await procs.finished(watching, watchers.DONE, window_s + 30)
        finally:
            await watching.stop()
            if stream is not None:
                await stream.close()
    finally:
        for client in clients:
            await client.close()
        await sidecar.stop()
    sent_at = {revision: sent[name] for name, (revision, _) in seen.items()}
    names = json.loads(notes.with_name("told.bin.names").read_text())
    base = names["base"]
    sent_at |= {int(rev): sent[name] for rev, name in names["names"].items() if name in sent}
    told = array.array("q", notes.read_bytes())
    for path in (notes, notes.with_name("told.bin.names")):
        path.unlink()
    notes.parent.rmdir()
    lags = Samples.of([at - sent[name] for name, (_, at) in seen.items()] or [0])
    p50_ms, p99_ms = (lags.p50 / 1e6, lags.p99 / 1e6) if seen else (float("inf"),) * 2
    late_s = _told_within(told, registrations, base, sent_at)
    told_s = [late for late in late_s if late != float("inf")]
    never = len(late_s) - len(told_s)
    worst_s = max(told_s, default=0.0) if not never else window_s  # never told: the window
    shown = f"{len(seen):,}/{registrations:,} seen, p50 {p50_ms:.0f} ms, p99 {p99_ms:.0f} ms"
    details = {
        "seen": len(seen),
        "registrations": registrations,
        "missed_reported": sum(missed),
        "lag_p50_ms": round(p50_ms, 1),
        "lag_p99_ms": round(p99_ms, 1),
        "burst_s": round(burst_s, 2),
        "registration_p50_ms": round(Samples.of(calls).p50 / 1e6, 1),
        "plain_watchers": plain,
        "per_connection": per_channel,
        "senders": senders,
        "measured": "from the start of each RegisterSection call to the batching watcher "
        f"(the Python client, change-batches) reading its event, within {after_burst_s:g} s "
        "after the burst; the plain watchers read in a process of their own",
    }
    batched_met = len(seen) == registrations and p50_ms <= TARGETS["beside_plain_lag_ms"]
    judged: Judged = {
        "target": f"all seen, p50 ≤ {TARGETS['beside_plain_lag_ms']:g} ms",
        "met": batched_met,
    }
    plain_details = {
        "told_p50_s": round(sorted(late_s)[len(late_s) // 2], 2) if not never else None,
        "worst_told_s": round(max(told_s, default=0.0), 2),
        "never_told": never,
        "watchers": plain,
        "measured": "for each plain watcher (no change-batches), the longest time from the "
        "start of a RegisterSection call to the watcher reading its event or a "
        f"ChangesMissed covering it (never within {window_s:g} s: never_told)",
    }
    return [
        figure(
            "beside_plain_lag",
            "a batching watcher beside 900 plain ones, 1,500 registrations",
            p50_ms,
            "ms p50",
            judged,
            details,
            display=shown,
        ),
        figure(
            "plain_watchers_told",
            "900 plain watchers through it: up to date or told, at the latest",
            worst_s,
            "s",
            at_most(worst_s, TARGETS["plain_watchers_told_s"], "≤ {:g} s"),
            plain_details,
            display=f"{never} never told within {window_s:g} s"
            if never
            else f"{worst_s:.2f} s worst",
        ),
    ]


async def _watch_all(
    stream: dsp.ChangeStream, expected: int, seen: dict[str, tuple[int, int]], missed: list[int]
) -> None:
    """Note name -> (revision, when read) of each registration `stream` reads in `seen`, and
    the count of each ChangesMissed in `missed`, until `expected` are accounted for."""
    async for item in stream:
        now = time.perf_counter_ns()
        if isinstance(item, dsp.ChangesMissed):
            missed.append(item.count)
        elif isinstance(item, dsp.ChangeEvent) and item.action == "registered":
            seen[item.name] = (item.revision, now)
        if len(seen) + sum(missed) >= expected:
            return


def _told_within(
    told: array.array[int], count: int, base: int, sent_at: dict[int, int]
) -> list[float]:
    """Per watcher, the longest a revision of base + 1 ... base + count waited (from its
    call's start) until the watcher was told of it, in seconds; inf when some never were. A
    revision whose name nobody read (every watcher missed it) is timed from the revision
    before it that one did."""
    known = sorted(sent_at)
    late: list[float] = []
    for start in range(0, len(told), count):
        worst = 0.0
        for offset in range(count):
            at = told[start + offset]
            if not at:
                worst = float("inf")
                break
            revision = base + 1 + offset
            index = bisect.bisect_right(known, revision) - 1
            if index < 0:
                continue
            worst = max(worst, (at - sent_at[known[index]]) / 1e9)
        late.append(worst)
    return late


async def prompt_watchers_beside(h: Harness) -> list[Figure]:
    """Another client's Assemble p50 and p99 beside 256 WatchPrompt streams of one 3.5 MiB
    scope that changes every 0.2 s (the hostile soak's prompt-watchers, which read their
    first prompt and no more), over the same with none, no credentials."""
    count, period_s = h.budget.n(400), 0.2
    sidecar = await procs.start_sidecar(label="sidecar-prompt-watchers")
    channels: list[grpc.aio.Channel] = []
    try:
        async with (
            dsp.connect(sidecar.address, client_name="bench-big") as owner,
            dsp.connect(sidecar.address, client_name="bench-caller") as caller,
        ):
            big = await owner.scope("big")
            parts = [
                await big.section(f"big-{index}", index, chr(ord("a") + index) * BIG_PART)
                for index in range(14)
            ]
            small = await caller.scope("small")
            await small.section("note", 1, "A small scope.")
            alone = await _assemble_samples(caller, count)
            for _ in range(4):  # four connections of 64, as the soak opens them
                channels.append(grpc.aio.insecure_channel(sidecar.address, options=OWN_CONNECTION))
                stub = pb_grpc.SystemPromptServiceStub(channels[-1])
                for _ in range(64):
                    call = stub.WatchPrompt(pb.WatchPromptRequest(scope="big"))
                    await call.read()  # its first prompt; it reads no more

            async def churn() -> None:
                for index in itertools.count():
                    await parts[0].update(f"{index} " + "a" * BIG_PART)
                    await asyncio.sleep(period_s)

            churning = asyncio.create_task(churn())
            try:
                beside = await _assemble_samples(caller, count)
            finally:
                churning.cancel()
    finally:
        for channel in channels:
            await channel.close(grace=None)
        await sidecar.stop()
    details = {
        "alone": alone.summary_us(),
        "beside": beside.summary_us(),
        "p99_ratio": round(beside.p99 / alone.p99, 2),
        "watchers": 256,
        "scope_mib": round(14 * BIG_PART / (1 << 20), 2),
        "change_every_s": period_s,
        "measured": "Assemble of a small scope by another client, one at a time; the "
        "watchers and the churn run in the bench process too",
    }
    name = "Assemble p50 beside 256 prompt watchers of a 3.5 MiB scope / none"
    limit = TARGETS["prompt_watchers_beside"]
    return [slowdown("prompt_watchers_beside", name, beside.p50, alone.p50, limit, details)]


async def _assemble_samples(client: dsp.Client, count: int) -> Samples:
    stopwatch = Stopwatch()
    for _ in range(count):
        await stopwatch.timed(lambda: client.assemble("small"))
    return stopwatch.samples()
