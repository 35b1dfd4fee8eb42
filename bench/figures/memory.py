"""Memory: sessions that come and go leave nothing behind; what the static memo holds."""

from __future__ import annotations

import asyncio
import os
import time
import tracemalloc
from collections.abc import Callable

import dsh_system_prompt as dsp
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import parse_config, start_sidecar
from dsh_system_prompt_server.rpc.assemble.response_cache import ResponseCache

from .. import procs, workload
from ..report import Figure, Judged, X, at_most
from ..stats import ratio
from ..targets import TARGETS
from .build import figure
from .harness import BUILTIN_SECTIONS, Harness, Probe, collect_garbage

MAX_GROWTH_PCT = TARGETS["session_memory"]


async def session_memory(h: Harness) -> list[Figure]:
    """Open a session, register a section, close it: 10,000 times after a warm-up."""
    cycles, warmup, workers = h.budget.n(10_000), h.budget.n(500), 8
    sidecar = await procs.start_sidecar(label="sidecar-sessions")
    try:
        rss_start = sidecar.rss_kib()
        await _cycles(sidecar.address, warmup, workers)
        await asyncio.sleep(0.5)  # let the sidecar finish closing the last sessions
        rss_before = sidecar.rss_kib()
        started = time.perf_counter()
        await _cycles(sidecar.address, cycles, workers)
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0.5)
        rss_after = sidecar.rss_kib()
        async with dsp.connect(sidecar.address, client_name="bench-check") as check:
            left = await check.assemble()
    finally:
        await sidecar.stop()
    growth = (rss_after - rss_before) / rss_before * 100
    leftover_sections = sorted({s.name for s in left.sections} - BUILTIN_SECTIONS)
    empty = not (leftover_sections or left.contexts or left.tools or left.variables)
    details = {
        "cycles": cycles,
        "warmup_cycles": warmup,
        "concurrent_workers": workers,
        "cycle": "dsp.connect() (new channel + session), one section(), close()",
        "cycles_per_s": round(cycles / elapsed),
        "rss_start_kib": rss_start,
        "rss_after_warmup_kib": rss_before,
        "rss_after_kib": rss_after,
        "registry_empty": empty,
        "leftover_sections": leftover_sections,
    }
    judged: Judged = {
        "target": f"< {MAX_GROWTH_PCT} %, registry empty",
        "met": growth < MAX_GROWTH_PCT and empty,
    }
    shown = f"{growth:+.1f} %, registry {'empty' if empty else 'NOT empty'}"
    name = f"{cycles:,} session open → register → close cycles: RSS growth"
    return [figure("session_memory", name, growth, "%", judged, details, digits=1, display=shown)]


async def _cycles(address: str, count: int, workers: int) -> None:
    remaining = iter(range(count))

    async def worker() -> None:
        for i in remaining:
            async with dsp.connect(address, client_name=f"bench-cycle-{i}") as client:
                await client.section(f"cycle-{i}", 10, "A section that lives for one session.")

    await asyncio.gather(*(worker() for _ in range(workers)))


MESSAGE_COPIES = 300


async def memo_memory(h: Harness) -> list[Figure]:
    """What the static memo holds per assembled scope, against the size of the response
    it answers: measured as the memory freed when the memo is dropped (tracemalloc),
    in a sidecar served by the bench process itself so its heap can be traced."""
    scopes = 50
    sidecar = await start_sidecar(parse_config({}), "127.0.0.1:0")
    owner = await dsp.connect(sidecar.address, client_name="bench-memo")
    probe = Probe.open(sidecar.address)
    try:
        await workload.load_client(owner, h.load)
        for index in range(scopes):
            await owner.scope(f"memo-{index:03d}")
        collect_garbage()
        tracemalloc.start()
        encoded = [len(await probe.raw_assemble(f"memo-{index:03d}")) for index in range(scopes)]
        held = _freed_by(lambda: setattr(sidecar.state.assembler, "responses", ResponseCache()))
        tracemalloc.stop()
        as_messages = _held_as_messages(await probe.raw_assemble("memo-000"), MESSAGE_COPIES)
    finally:
        await probe.close()
        await owner.close()
        await sidecar.server.stop(grace=None)
    per_scope, size = held / scopes, sum(encoded) / scopes
    value = ratio(per_scope, size)
    details = {
        "memo_bytes_per_scope": round(per_scope),
        "encoded_bytes_per_scope": round(size),
        "as_message_objects_bytes_per_scope": round(as_messages / MESSAGE_COPIES),
        "scopes": scopes,
        "method": "a sidecar in the bench process holding the realistic load; each of "
        f"{scopes} scopes assembled once (rendered); the memo's memory is what "
        "tracemalloc sees freed when the service's response cache is dropped; beside "
        "it, the RSS growth per parsed AssembleResponse object (what the memo held "
        f"before it held bytes), over {MESSAGE_COPIES} copies",
    }
    judged = at_most(value, TARGETS["memo_memory"], "≤ {:g} (the bytes, their header and key)")
    name = "static memo per assembled scope / its encoded response"
    return [figure("memo_memory", name, value, X, judged, details, digits=3)]


def _freed_by(drop: Callable[[], None]) -> int:
    """Traced bytes freed by `drop()` (and the collection after it)."""
    collect_garbage()
    before = tracemalloc.get_traced_memory()[0]
    drop()
    collect_garbage()
    return before - tracemalloc.get_traced_memory()[0]


def _held_as_messages(encoded: bytes, count: int) -> int:
    """Resident bytes added by `count` parsed copies of one AssembleResponse (protobuf's
    arenas are outside tracemalloc's sight, so this is the process's RSS growth)."""
    collect_garbage()
    before = _rss_bytes()
    held = [pb.AssembleResponse.FromString(encoded) for _ in range(count)]
    for message in held:
        message.assembly.sections[0].name  # noqa: B018 - touch it, as a reader would
    size = _rss_bytes() - before
    del held
    return size


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
