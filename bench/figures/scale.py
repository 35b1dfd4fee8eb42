"""The assemble under scale: many other scopes, a report history, concurrent clients,
and the transport (unix socket or loopback TCP)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from typing import Any

import dsh_system_prompt as dsp

from .. import procs
from ..report import Figure, X, at_least
from ..stats import ORDER_SEED, Operation, ratio
from ..targets import TARGETS
from .build import figure, p50_ratio, timed_ratio_details
from .harness import OWN_CONNECTION, Harness, Probe, fresh_sidecars, gather_limited


async def many_scopes(h: Harness) -> list[Figure]:
    """The client assemble on a sidecar that also holds 1,000 other scopes, each
    with 20 sections and one scoped listener, vs the same on a twin without them."""
    # 10 holders: 100 scoped listeners each, as many as one client may hold
    # (limits.max_listeners_per_peer; each client is a loopback connection of its own)
    scopes, per_scope, holders = 1000, 20, 10
    started = time.perf_counter()
    clients: list[dsp.Client] = []
    async with fresh_sidecars(h, "127.0.0.1:0", "127.0.0.1:0", label="scopes") as (plain, loaded):
        try:
            for i in range(holders):
                clients.append(await dsp.connect(loaded.address, client_name=f"bench-scopes-{i}"))

            async def untouched(
                assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
            ) -> Any:
                return next_()

            async def fill(index: int) -> None:
                scope = await clients[index % holders].scope(f"agent-{index:04d}")
                for j in range(per_scope):
                    await scope.section(f"agent-section-{j:02d}", j, f"Agent {index} rule {j}.")
                await scope.on_assemble(untouched)

            await gather_limited([fill(i) for i in range(scopes)], limit=50)
            setup_s = time.perf_counter() - started
            probe_loaded = await dsp.connect(loaded.address, client_name="bench-probe")
            probe_plain = await dsp.connect(plain.address, client_name="bench-probe")
            clients += [probe_loaded, probe_plain]
            samples = await h.timed(
                {"with_1000_scopes": probe_loaded.assemble, "without": probe_plain.assemble}, 1500
            )
            rss_mib = {"with": loaded.rss_kib() // 1024, "without": plain.rss_kib() // 1024}
        finally:
            for client in reversed(clients):
                await client.close()
    return [
        p50_ratio(
            samples,
            "with_1000_scopes",
            "without",
            TARGETS["many_scopes"],
            key="many_scopes",
            name="client assemble with 1,000 other scopes / with none",
            details={
                "other_scopes": scopes,
                "registrations_per_scope": per_scope,
                "listeners": scopes,
                "setup_s": round(setup_s, 1),
                "sidecar_rss_mib": rss_mib,
                "method": "two fresh sidecar processes with the same load, one also holding "
                "the scopes; the probes (one client each) alternate between them",
            },
        )
    ]


async def report_cost(h: Harness) -> list[Figure]:
    """Assemblies that do not ask for a report, on a sidecar that has reported on
    1,000 scopes, vs the same on a twin that never reported: the report costs
    nothing to those who do not ask. The reported assembly's own cost is context."""
    scopes = 1000
    async with fresh_sidecars(h, "127.0.0.1:0", "127.0.0.1:0", label="reports") as (plain, used):
        probe_plain, probe_used = Probe.open(plain.address), Probe.open(used.address)
        try:
            for index in range(scopes):
                for _ in range(2):  # two reports each: a history to compare with
                    await probe_used.assemble_report(f"agent-{index:04d}")()
            samples = await h.timed(
                {
                    "after_1000_reported_scopes": probe_used.assemble(),
                    "never_reported": probe_plain.assemble(),
                    "asking_for_a_report": probe_used.assemble_report(),
                },
                1500,
            )
        finally:
            await probe_plain.close()
            await probe_used.close()
    return [
        p50_ratio(
            samples,
            "after_1000_reported_scopes",
            "never_reported",
            TARGETS["report_cost"],
            key="report_cost",
            name="assemble without a report, after 1,000 reported scopes / never reported",
            details={
                "report_over_plain_p50": round(
                    ratio(samples["asking_for_a_report"].p50, samples["never_reported"].p50), 2
                ),
                "method": "two fresh sidecar processes with the realistic load; one first "
                "answers 2 reported assemblies for each of 1,000 scopes; raw Assemble (rendered) "
                "alternates between them",
            },
        )
    ]


async def throughput(h: Harness) -> list[Figure]:
    """8 clients, each on its own connection, as fast as they can: the sidecar's
    assemblies/s vs a bare grpc.aio server's (the floor) answering the very same bytes,
    in phases shuffled each round; the sidecar's empty RPCs/s beside them."""
    # Many short phases: on a shared machine every operation sees the same load (3 of 1.5 s
    # gave 0.55-1.54 from one build; 12 of 0.4 s, 0.77-0.85).
    clients, rounds = 8, 12
    phase_s, warmup_s = h.budget.seconds(0.4), h.budget.seconds(0.5)
    response = await _assembled_bytes(h.sidecar.address)
    bare = await procs.start_floor(response=response)
    probes = [Probe.open(h.sidecar.address, OWN_CONNECTION) for _ in range(clients)]
    on_bare = [Probe.open(bare.address, OWN_CONNECTION) for _ in range(clients)]
    operations: dict[str, list[Operation]] = {
        "assemble": [p.assemble() for p in probes],
        "bare_assemble": [p.assemble() for p in on_bare],
        "empty_rpc": [p.empty for p in probes],
    }
    servers = {"assemble": h.sidecar, "bare_assemble": bare, "empty_rpc": h.sidecar}
    counts = {name: 0 for name in operations}
    server_cpu = {name: 0.0 for name in operations}
    bench_cpu = {name: 0.0 for name in operations}
    order = random.Random(ORDER_SEED)
    try:
        for ops in operations.values():
            await _saturate(ops, warmup_s)
        names = list(operations)
        for _ in range(rounds):
            order.shuffle(names)
            for name in names:
                server = servers[name]
                server_before, bench_before = server.cpu_seconds(), time.process_time()
                counts[name] += await _saturate(operations[name], phase_s)
                server_cpu[name] += server.cpu_seconds() - server_before
                bench_cpu[name] += time.process_time() - bench_before
    finally:
        for probe in probes + on_bare:
            await probe.close()
        await bare.stop()
    elapsed = rounds * phase_s
    rates = {name: counts[name] / elapsed for name in operations}
    value = ratio(rates["assemble"], rates["bare_assemble"])
    per_call = {name: server_cpu[name] / counts[name] for name in operations}
    details = {
        "assemblies_per_s": round(rates["assemble"]),
        "bare_assemblies_per_s": round(rates["bare_assemble"]),
        "empty_rpcs_per_s": round(rates["empty_rpc"]),
        "assemblies_over_empty_rpcs": round(ratio(rates["assemble"], rates["empty_rpc"]), 2),
        "response_bytes": len(response),
        # Which process saturates: ~1.0 s of CPU per second is one full core.
        "server_cpu_s_per_s": {name: round(cpu / elapsed, 2) for name, cpu in server_cpu.items()},
        "bench_cpu_s_per_s": {name: round(cpu / elapsed, 2) for name, cpu in bench_cpu.items()},
        "server_cpu_us_per_call": {name: round(cpu * 1e6) for name, cpu in per_call.items()},
        # The same ratio from the servers' CPU per call: what it would be with each server
        # saturated, less sensitive to other load on the host.
        "cpu_capacity_ratio": round(ratio(per_call["bare_assemble"], per_call["assemble"]), 2),
        "clients": clients,
        "phases": f"{rounds} rounds of one {phase_s:g} s phase per operation, shuffled",
        "assemble": "Assemble with render: true through the generated stub (the response"
        " decoded into an AssembleResponse, no client objects)",
        "bare": "bench/floor.py: a bare grpc.aio server in its own process answering Assemble"
        " with the bytes the sidecar answered, no parsing, no registry",
        "note": "the 8 clients share the bench process; each has its own connection",
    }
    shown = f"{value:.2f}{X} ({rates['assemble']:,.0f} vs {rates['bare_assemble']:,.0f}/s)"
    name = "8 concurrent clients: assemblies/s / a bare grpc.aio server's, same bytes"
    judged = at_least(value, TARGETS["throughput_vs_bare"])
    return [figure("throughput_vs_bare", name, value, X, judged, details, display=shown)]


async def _assembled_bytes(address: str) -> bytes:
    probe = Probe.open(address)
    try:
        return await probe.raw_assemble()
    finally:
        await probe.close()


async def _saturate(operations: list[Operation], seconds: float) -> int:
    """Run every operation back to back for `seconds`; how many completed."""
    deadline = time.perf_counter() + seconds
    done = 0

    async def loop(operation: Operation) -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await operation()
            done += 1

    await asyncio.gather(*(loop(op) for op in operations))
    return done


async def unix_vs_tcp(h: Harness) -> list[Figure]:
    """The static assemble over a unix socket vs over loopback TCP."""
    path = f"/tmp/dsp-bench-{os.getpid()}.sock"
    try:
        async with fresh_sidecars(h, f"unix:{path}", "127.0.0.1:0", label="transport") as pair:
            over_unix, over_tcp = (Probe.open(sidecar.address) for sidecar in pair)
            try:
                samples = await h.timed(
                    {
                        "assemble_unix": over_unix.assemble(),
                        "assemble_tcp": over_tcp.assemble(),
                        "empty_rpc_unix": over_unix.empty,
                        "empty_rpc_tcp": over_tcp.empty,
                    },
                    1000,
                )
            finally:
                await over_unix.close()
                await over_tcp.close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    value = ratio(samples["assemble_unix"].p50, samples["assemble_tcp"].p50)
    empty = ratio(samples["empty_rpc_unix"].p50, samples["empty_rpc_tcp"].p50)
    faster = "unix socket" if value < 1 else "loopback TCP"
    difference_pct = abs(1 - value) * 100
    details = {
        **timed_ratio_details(samples),
        "empty_rpc_ratio": round(empty, 2),
        "faster": faster,
        "difference_pct": round(difference_pct, 1),
    }
    shown = f"{value:.3f}{X} p50 ({faster} {difference_pct:.1f} % faster)"
    name = "static assemble over a unix socket / over loopback TCP"
    return [
        figure("unix_vs_tcp", name, value, f"{X} p50", "reported", details, digits=3, display=shown)
    ]
