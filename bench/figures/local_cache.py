"""The clients' local cache (`connect(local_cache=True)`): a cached assemble() of the
realistic (all-static) load, with no RPC, and how long another client's write takes to
reach it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import dsh_system_prompt as dsp

from .. import node
from ..report import Figure, Judged
from ..stats import Samples
from .harness import Harness

P50_LIMIT_US, P99_LIMIT_US = 50.0, 100.0  # the Python client's cached assemble()


async def local_cache_assemble(h: Harness) -> list[Figure]:
    """The Python client's assemble() answered from its local cache; the sidecar's CPU
    during the timed calls shows it was not asked."""
    client = await dsp.connect(h.sidecar.address, client_name="bench-local", local_cache=True)
    warmup, iterations = h.budget.n(500), h.budget.n(5000)
    try:
        for _ in range(warmup):
            await client.assemble()
        cpu_before = h.sidecar.cpu_seconds()
        ns: list[int] = []
        for _ in range(iterations):
            start = time.perf_counter_ns()
            assembly = await client.assemble()
            ns.append(time.perf_counter_ns() - start)
        sidecar_cpu_s = h.sidecar.cpu_seconds() - cpu_before
    finally:
        await client.close()
    details = {
        "sidecar_cpu_s_during_run": round(sidecar_cpu_s, 4),
        "tools": len(assembly.tools),
        "sections": len(assembly.sections),
    }
    samples = Samples.of(ns)
    limits = f"p50 ≤ {P50_LIMIT_US:g} µs, p99 ≤ {P99_LIMIT_US:g} µs"
    met = samples.p50 / 1000 <= P50_LIMIT_US and samples.p99 / 1000 <= P99_LIMIT_US
    name = "client assemble() from the local cache (Python, no RPC)"
    return [_micros("local_cache_assemble", name, samples, {"target": limits, "met": met}, details)]


def _micros(
    key: str, name: str, samples: Samples, judged: Judged | None, details: dict[str, Any]
) -> Figure:
    """A figure of p50 and p99 in microseconds; only reported without `judged`."""
    p50, p99 = samples.p50 / 1000, samples.p99 / 1000
    return Figure(
        key=key,
        name=name,
        value=round(p50, 1),
        unit="µs p50",
        target="reported beside the Python figure" if judged is None else judged["target"],
        met=None if judged is None else judged["met"],
        display=f"{p50:.1f} µs p50, {p99:.1f} µs p99",
        details={"samples": samples.summary_us(), **details},
    )


async def ts_local_cache_assemble(h: Harness) -> list[Figure]:
    """The TypeScript client's cached assemble(), beside the Python figure."""
    iterations, warmup = h.budget.n(5000), h.budget.n(500)
    measured = await node.run_bench("local_cache.js", h.sidecar.address, iterations, warmup)
    samples = Samples.of(measured["cached_assemble"])
    name = "TypeScript client assemble() from the local cache (Node, no RPC)"
    return [_micros("ts_local_cache_assemble", name, samples, None, {"node": measured["node"]})]


async def local_cache_staleness(h: Harness) -> list[Figure]:
    """Another client updates a static section; the time from its update() returning to
    the caching client's assemble() first giving the new value (its change stream)."""
    writer = await dsp.connect(h.sidecar.address, client_name="bench-writer")
    reader = await dsp.connect(h.sidecar.address, client_name="bench-reader", local_cache=True)
    scope_name = "local-cache-staleness"
    rounds = h.budget.n(300)
    ns: list[int] = []
    try:
        scope = await writer.scope(scope_name)
        handle = await scope.section("turn", 1, "turn 0")
        await _seen(reader, scope_name, "turn 0")
        for turn in range(1, rounds + 1):
            await handle.update(f"turn {turn}")
            start = time.perf_counter_ns()
            await _seen(reader, scope_name, f"turn {turn}")
            ns.append(time.perf_counter_ns() - start)
    finally:
        await reader.close()
        await writer.close()
    samples = Samples.of(ns)
    p99_ms = samples.p99 / 1e6
    return [
        Figure(
            key="local_cache_staleness",
            name="local cache: another client's write reaches assemble() (p99)",
            value=round(p99_ms, 2),
            unit="ms p99",
            target="reported (watch_coalesce_s 5 ms, the default)",
            met=None,
            display=f"{p99_ms:.2f} ms p99, {samples.p50 / 1e6:.2f} ms p50",
            details={"samples": samples.summary_us(), "rounds": rounds},
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
