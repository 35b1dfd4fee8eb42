"""The clients' local cache (`connect(local_cache=True)`): a cached assemble() of the
realistic (all-static) load, with no RPC, and how long another client's write takes to
reach it."""

from __future__ import annotations

import asyncio
import functools

import dsh_system_prompt as dsp

from .. import node
from ..report import Figure, Judged
from ..stats import Samples, Stopwatch
from ..targets import TARGETS
from .build import percentiles
from .harness import Harness

P50_LIMIT_US = TARGETS["local_cache_assemble_p50_us"]  # the Python client's cached assemble()
P99_LIMIT_US = TARGETS["local_cache_assemble_p99_us"]


async def local_cache_assemble(h: Harness) -> list[Figure]:
    """The Python client's assemble() answered from its local cache; the sidecar's CPU
    during the timed calls shows it was not asked."""
    client = await dsp.connect(h.sidecar.address, client_name="bench-local", local_cache=True)
    warmup, iterations = h.budget.n(500), h.budget.n(5000)
    stopwatch = Stopwatch()
    try:
        for _ in range(warmup):
            await client.assemble()
        cpu_before = h.sidecar.cpu_seconds()
        for _ in range(iterations):
            assembly = await stopwatch.timed(client.assemble)
        sidecar_cpu_s = h.sidecar.cpu_seconds() - cpu_before
    finally:
        await client.close()
    details = {
        "sidecar_cpu_s_during_run": round(sidecar_cpu_s, 4),
        "tools": len(assembly.tools),
        "sections": len(assembly.sections),
    }
    samples = stopwatch.samples()
    judged: Judged = {
        "target": f"p50 ≤ {P50_LIMIT_US:g} µs, p99 ≤ {P99_LIMIT_US:g} µs",
        "met": samples.p50 / 1000 <= P50_LIMIT_US and samples.p99 / 1000 <= P99_LIMIT_US,
    }
    name = "client assemble() from the local cache (Python, no RPC)"
    return [percentiles("local_cache_assemble", name, samples, judged, details)]


async def ts_local_cache_assemble(h: Harness) -> list[Figure]:
    """The TypeScript client's cached assemble(), beside the Python figure."""
    iterations, warmup = h.budget.n(5000), h.budget.n(500)
    measured = await node.run_bench("local_cache.js", h.sidecar.address, iterations, warmup)
    samples = Samples.of(measured["cached_assemble"])
    name = "TypeScript client assemble() from the local cache (Node, no RPC)"
    beside = "reported beside the Python figure"
    return [
        percentiles("ts_local_cache_assemble", name, samples, beside, {"node": measured["node"]})
    ]


async def local_cache_staleness(h: Harness) -> list[Figure]:
    """Another client updates a static section; the time from its update() returning to
    the caching client's assemble() first giving the new value (its change stream)."""
    writer = await dsp.connect(h.sidecar.address, client_name="bench-writer")
    reader = await dsp.connect(h.sidecar.address, client_name="bench-reader", local_cache=True)
    scope_name = "local-cache-staleness"
    rounds = h.budget.n(300)
    stopwatch = Stopwatch()
    try:
        scope = await writer.scope(scope_name)
        handle = await scope.section("turn", 1, "turn 0")
        await _seen(reader, scope_name, "turn 0")
        for turn in range(1, rounds + 1):
            await handle.update(f"turn {turn}")
            await stopwatch.timed(functools.partial(_seen, reader, scope_name, f"turn {turn}"))
    finally:
        await reader.close()
        await writer.close()
    name = "local cache: another client's write reaches assemble() (p99)"
    reported = "reported (watch_coalesce_s 5 ms, the default)"
    return [
        percentiles(
            "local_cache_staleness",
            name,
            stopwatch.samples(),
            reported,
            {"rounds": rounds},
            unit="ms",
            headline=99,
        )
    ]


async def _seen(client: dsp.Client, scope: str, text: str) -> None:
    """Assemble until the section reads `text` (kept answers cost microseconds)."""
    while True:
        if _text(await client.assemble(scope), "turn") == text:
            return
        await asyncio.sleep(0)  # let the change stream's reader run


def _text(assembly: dsp.PromptAssembly, name: str) -> str:
    return next(section.text for section in assembly.sections if section.name == name)
