"""One function per figure of the issue; each returns the figures it measured.

Every comparison is measured side by side in the same run, interleaved (see
`stats.interleaved`), and the figure is the ratio; absolute times are details.
The sidecars run in child processes (`procs`); the bench process is the client,
and it also hosts the client-side callables (dynamic providers, listeners).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Registry, RegistrySettings, parse_config, start_sidecar
from dsh_system_prompt_server.registry import AssembleContext
from dsh_system_prompt_server.rpc.response_cache import ResponseCache
from grpc_health.v1 import health_pb2, health_pb2_grpc

from . import golang, node, procs, workload
from .echo import EchoStream
from .report import Figure, X, at_least, at_most, below
from .stats import Operation, Samples, interleaved, ratio

BUILTIN_SECTIONS = {"harness:identity", dsp.PERSONA_SECTION}
# Each "client" of the throughput figure gets its own connection: channels in one
# process otherwise share one subchannel (one TCP connection) per target.
ASSEMBLE_METHOD = "/dsh.systemprompt.v1.SystemPromptService/Assemble"
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Budget:
    """Iteration counts; `scale` < 1 shortens every figure (`--quick`)."""

    scale: float = 1.0

    def n(self, full: int) -> int:
        return max(10, int(full * self.scale))

    def seconds(self, full: float) -> float:
        return max(0.2, full * self.scale)


@dataclass
class Harness:
    """What most figures share: the load, a sidecar serving it, the echo server."""

    load: workload.Workload
    sidecar: procs.ServerProcess  # loopback TCP, the load registered by `owner`
    owner: dsp.Client
    echo: procs.ServerProcess
    budget: Budget

    @classmethod
    async def start(cls, budget: Budget) -> Harness:
        load = workload.build()
        sidecar, echo = await asyncio.gather(
            procs.start_sidecar(label="sidecar"), procs.start_echo()
        )
        owner = await dsp.connect(sidecar.address, client_name="bench-load")
        await workload.load_client(owner, load)
        return cls(load, sidecar, owner, echo, budget)

    async def close(self) -> None:
        await self.owner.close()
        await asyncio.gather(self.sidecar.stop(), self.echo.stop())


# -- helpers --------------------------------------------------------------------------


class Probe:
    """Raw calls over one channel: the static Assemble (rendered) and Health.Check."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._stub = pb_grpc.SystemPromptServiceStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._check = health_pb2.HealthCheckRequest()

    @classmethod
    def open(cls, address: str, options: list[tuple[str, Any]] | None = None) -> Probe:
        return cls(grpc.aio.insecure_channel(address, options=options))

    def assemble(self, scope: str = "") -> Operation:
        """Assemble `scope` with `render: true`: the rendered prompt comes back."""
        request = pb.AssembleRequest(context=pb.AssembleContext(scope=scope), render=True)

        async def call() -> object:
            return await self._stub.Assemble(request)

        return call

    def assemble_report(self, scope: str = "") -> Operation:
        """Assemble `scope` rendered and with a prompt-cache report."""
        request = pb.AssembleRequest(
            context=pb.AssembleContext(scope=scope), render=True, report=True
        )

        async def call() -> object:
            return await self._stub.Assemble(request)

        return call

    async def raw_assemble(self, scope: str = "") -> bytes:
        """Assemble `scope` rendered; the response's encoding as it came."""
        request = pb.AssembleRequest(context=pb.AssembleContext(scope=scope), render=True)
        call = self.channel.unary_unary(
            ASSEMBLE_METHOD, request_serializer=pb.AssembleRequest.SerializeToString
        )
        encoded: bytes = await call(request)
        return encoded

    async def empty(self) -> object:
        """The empty unary RPC: grpc.health.v1.Health/Check."""
        return await self._health.Check(self._check)

    async def close(self) -> None:
        await self.channel.close()


@contextlib.asynccontextmanager
async def echo_stream(address: str) -> AsyncIterator[EchoStream]:
    channel = grpc.aio.insecure_channel(address)
    stream = EchoStream(channel)
    try:
        await stream.round_trip()  # open the stream before timing
        yield stream
    finally:
        await stream.close()
        await channel.close()


@contextlib.asynccontextmanager
async def fresh_sidecars(
    h: Harness, *listens: str, label: str
) -> AsyncIterator[list[procs.ServerProcess]]:
    """New sidecars, one per address, each holding the realistic load (global layer)."""
    sidecars: list[procs.ServerProcess] = []
    owners: list[dsp.Client] = []
    try:
        for i, listen in enumerate(listens):
            sidecars.append(await procs.start_sidecar(listen, label=f"sidecar-{label}-{i}"))
        for sidecar in sidecars:
            owners.append(await dsp.connect(sidecar.address, client_name="bench-load"))
            await workload.load_client(owners[-1], h.load)
        yield sidecars
    finally:
        for owner in owners:
            await owner.close()
        await asyncio.gather(*(sidecar.stop() for sidecar in sidecars))


def _us(ns: float) -> float:
    return round(ns / 1000, 1)


def _timed_ratio_details(samples: dict[str, Samples]) -> dict[str, Any]:
    return {name: s.summary_us() for name, s in samples.items()}


async def _gather_limited(jobs: list[Awaitable[Any]], limit: int) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def run(job: Awaitable[Any]) -> Any:
        async with semaphore:
            return await job

    return await asyncio.gather(*(run(job) for job in jobs))


# -- figures --------------------------------------------------------------------------


async def in_process(h: Harness) -> list[Figure]:
    """Registry assemble + render_prompt + render_context_snapshot, no gRPC."""
    registry = Registry(RegistrySettings())
    workload.load_registry(registry, h.load)
    context = AssembleContext()
    assemble_ns: list[int] = []
    render_ns: list[int] = []
    total_ns: list[int] = []
    warmup, iterations = h.budget.n(500), h.budget.n(5000)
    for i in range(warmup + iterations):
        start = time.perf_counter_ns()
        assembly = await registry.assemble(context)
        assembled = time.perf_counter_ns()
        dsp.render_prompt(assembly)
        dsp.render_context_snapshot(assembly)
        end = time.perf_counter_ns()
        if i >= warmup:
            assemble_ns.append(assembled - start)
            render_ns.append(end - assembled)
            total_ns.append(end - start)
    total = Samples.of(total_ns)
    p50 = total.p50 / 1000
    return [
        Figure(
            key="in_process",
            name="in-process assemble + render (realistic load)",
            value=round(p50, 1),
            unit="µs p50",
            **below(p50, 50, "p50 < {:g} µs"),
            details={
                "load": h.load.describe(),
                "total": total.summary_us(),
                "assemble": Samples.of(assemble_ns).summary_us(),
                "render": Samples.of(render_ns).summary_us(),
            },
        )
    ]


async def grpc_assemble(h: Harness) -> list[Figure]:
    """Assemble(render=true) vs Health.Check, same server, same channel."""
    probe = Probe.open(h.sidecar.address)
    try:
        samples = await interleaved(
            {"assemble": probe.assemble(), "empty_rpc": probe.empty},
            iterations=h.budget.n(2000),
            warmup=h.budget.n(200),
        )
    finally:
        await probe.close()
    value = ratio(samples["assemble"].p50, samples["empty_rpc"].p50)
    return [
        Figure(
            key="grpc_assemble",
            name="gRPC Assemble (static, rendered) / empty unary RPC",
            value=round(value, 2),
            unit=f"{X} p50",
            **at_most(value, 1.3),
            details={
                **_timed_ratio_details(samples),
                "baseline": "grpc.health.v1.Health/Check on the same channel",
            },
        )
    ]


async def client_assemble(h: Harness) -> list[Figure]:
    """The Python client's assemble() into its own objects vs Health.Check."""
    client = await dsp.connect(h.sidecar.address, client_name="bench-client")
    probe = Probe.open(h.sidecar.address)
    try:
        samples = await interleaved(
            {"client_assemble": client.assemble, "empty_rpc": probe.empty},
            iterations=h.budget.n(2000),
            warmup=h.budget.n(200),
        )
    finally:
        await client.close()
        await probe.close()
    value = ratio(samples["client_assemble"].p50, samples["empty_rpc"].p50)
    return [
        Figure(
            key="client_assemble",
            name="client assemble() end to end / empty unary RPC",
            value=round(value, 2),
            unit=f"{X} p50",
            **at_most(value, 1.2),
            details={
                **_timed_ratio_details(samples),
                "baseline": "grpc.health.v1.Health/Check from the same process, on a channel "
                "of its own to the same sidecar",
            },
        )
    ]


async def ts_client_assemble(h: Harness) -> list[Figure]:
    """The TypeScript client's assemble() vs Health.Check, both from one Node process."""
    iterations, warmup = h.budget.n(2000), h.budget.n(200)
    measured = await node.run_json(
        node.TS_CLIENT / "dist" / "bench" / "assemble.js",
        h.sidecar.address,
        str(iterations),
        str(warmup),
    )
    samples = {name: Samples.of(measured[name]) for name in ("client_assemble", "empty_rpc")}
    value = ratio(samples["client_assemble"].p50, samples["empty_rpc"].p50)
    return [
        Figure(
            key="ts_client_assemble",
            name="TypeScript client assemble() / empty unary RPC (Node)",
            value=round(value, 2),
            unit=f"{X} p50",
            target="≤ 1.6",
            met=value <= 1.6,
            details={
                **_timed_ratio_details(samples),
                "node": measured["node"],
                "baseline": "grpc.health.v1.Health/Check from the same Node process, on a "
                "channel of its own to the same sidecar",
            },
        )
    ]


async def go_client_assemble(h: Harness) -> list[Figure]:
    """The Go client's Assemble vs Health.Check, both from one Go process."""
    iterations, warmup = h.budget.n(2000), h.budget.n(200)
    measured = await golang.run_json(h.sidecar.address, str(iterations), str(warmup))
    samples = {name: Samples.of(measured[name]) for name in ("client_assemble", "empty_rpc")}
    value = ratio(samples["client_assemble"].p50, samples["empty_rpc"].p50)
    return [
        Figure(
            key="go_client_assemble",
            name="Go client Assemble / empty unary RPC (Go)",
            value=round(value, 2),
            unit=f"{X} p50",
            **at_most(value, 1.3),
            details={
                **_timed_ratio_details(samples),
                "go": measured["go"],
                "baseline": "grpc.health.v1.Health/Check from the same Go process, on a "
                "channel of its own to the same sidecar",
            },
        )
    ]


async def many_scopes(h: Harness) -> list[Figure]:
    """The client assemble on a sidecar that also holds 1,000 other scopes, each
    with 20 sections and one scoped listener, vs the same on a twin without them."""
    scopes, per_scope, holders = 1000, 20, 4
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

            await _gather_limited([fill(i) for i in range(scopes)], limit=50)
            setup_s = time.perf_counter() - started
            probe_loaded = await dsp.connect(loaded.address, client_name="bench-probe")
            probe_plain = await dsp.connect(plain.address, client_name="bench-probe")
            clients += [probe_loaded, probe_plain]
            samples = await interleaved(
                {"with_1000_scopes": probe_loaded.assemble, "without": probe_plain.assemble},
                iterations=h.budget.n(1500),
                warmup=h.budget.n(150),
            )
            rss_mib = {"with": loaded.rss_kib() // 1024, "without": plain.rss_kib() // 1024}
        finally:
            for client in reversed(clients):
                await client.close()
    value = ratio(samples["with_1000_scopes"].p50, samples["without"].p50)
    return [
        Figure(
            key="many_scopes",
            name="client assemble with 1,000 other scopes / with none",
            value=round(value, 2),
            unit=f"{X} p50",
            **at_most(value, 1.1),
            details={
                **_timed_ratio_details(samples),
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
            samples = await interleaved(
                {
                    "after_1000_reported_scopes": probe_used.assemble(),
                    "never_reported": probe_plain.assemble(),
                    "asking_for_a_report": probe_used.assemble_report(),
                },
                iterations=h.budget.n(1500),
                warmup=h.budget.n(150),
            )
        finally:
            await probe_plain.close()
            await probe_used.close()
    value = ratio(samples["after_1000_reported_scopes"].p50, samples["never_reported"].p50)
    return [
        Figure(
            key="report_cost",
            name="assemble without a report, after 1,000 reported scopes / never reported",
            value=round(value, 2),
            unit=f"{X} p50",
            **at_most(value, 1.1),
            details={
                **_timed_ratio_details(samples),
                "report_over_plain_p50": round(
                    ratio(samples["asking_for_a_report"].p50, samples["never_reported"].p50), 2
                ),
                "method": "two fresh sidecar processes with the realistic load; one first "
                "answers 2 reported assemblies for each of 1,000 scopes; raw Assemble (rendered) "
                "alternates between them",
            },
        )
    ]


async def dynamic_sections(h: Harness) -> list[Figure]:
    """10 dynamic sections answered by one session, and by 5, vs 10 static ones."""
    count = 10
    sessions: list[dsp.Client] = []
    probe = Probe.open(h.sidecar.address)
    static = await h.owner.scope("static-10")  # disposed at the end: the sidecar is shared
    try:
        for i in range(count):
            await static.section(f"extra-{i:02d}", 1000 + i, f"Extra section {i}, static.")
        one = await dsp.connect(h.sidecar.address, client_name="bench-dynamic-1")
        sessions.append(one)
        scope_one = await one.scope("dynamic-1-session")
        for i in range(count):
            await scope_one.section(f"extra-{i:02d}", 1000 + i, _provider(i))
        for s in range(5):
            client = await dsp.connect(h.sidecar.address, client_name=f"bench-dynamic-5-{s}")
            sessions.append(client)
            scope_five = await client.scope("dynamic-5-sessions")
            for i in range(s * 2, s * 2 + 2):
                await scope_five.section(f"extra-{i:02d}", 1000 + i, _provider(i))
        async with echo_stream(h.echo.address) as echo:
            samples = await interleaved(
                {
                    "static": probe.assemble("static-10"),
                    "dynamic_1_session": probe.assemble("dynamic-1-session"),
                    "dynamic_5_sessions": probe.assemble("dynamic-5-sessions"),
                    "bidi_round_trip": echo.round_trip,
                },
                iterations=h.budget.n(1000),
                warmup=h.budget.n(100),
            )
    finally:
        await static.dispose()
        for client in sessions:
            await client.close()
        await probe.close()
    return [
        _over_static(samples, key, label, "≤ static + {:g} round trips", limit, "dynamic sections")
        for key, label, limit in (
            ("dynamic_1_session", "10 dynamic sections, 1 session", 1.4),
            ("dynamic_5_sessions", "10 dynamic sections, 5 sessions", 2.5),
        )
    ]


def _provider(index: int) -> Callable[[dsp.AssembleContext], str]:
    def provide(context: dsp.AssembleContext) -> str:
        return f"Extra section {index}, dynamic."

    return provide


async def listeners(h: Harness) -> list[Figure]:
    """One waterfall listener that only works before next(), and one that
    post-processes next()'s result, vs the static assemble without one."""
    client = await dsp.connect(h.sidecar.address, client_name="bench-listeners")
    probe = Probe.open(h.sidecar.address)

    async def before_next(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> Any:
        assembly.sections.append(dsp.AssembledSection("listener:note", "Added before next()."))
        return next_()  # handed on un-awaited: one round trip

    async def post_process(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> dsp.PromptAssembly:
        result: dsp.PromptAssembly = await next_()
        result.sections.append(dsp.AssembledSection("listener:note", "Added after next()."))
        return result

    try:
        await (await client.scope("listener-before")).on_assemble(before_next)
        await (await client.scope("listener-after")).on_assemble(post_process)
        async with echo_stream(h.echo.address) as echo:
            samples = await interleaved(
                {
                    "static": probe.assemble(),
                    "before_next": probe.assemble("listener-before"),
                    "post_processing": probe.assemble("listener-after"),
                    "bidi_round_trip": echo.round_trip,
                },
                iterations=h.budget.n(1000),
                warmup=h.budget.n(100),
            )
    finally:
        await client.close()
        await probe.close()
    return [
        _over_static(
            samples, "before_next", "listener, before next() only", "≤ {:g} round trips", 1.4
        ),
        _over_static(
            samples, "post_processing", "listener, with post-processing", "≤ {:g} round trips", 2.6
        ),
    ]


async def cached_callbacks(h: Harness) -> list[Figure]:
    """Scopes whose providers and listeners all declared a cache policy (Cache.REVISION),
    assembled with unchanged inputs, vs the empty RPC: no hop, whatever their number."""
    sessions: list[dsp.Client] = []
    probe = Probe.open(h.sidecar.address)
    shapes = {"cached_10_providers_1_listener": 1, "cached_10_providers_10_listeners": 10}
    try:
        for s in range(5):  # 10 providers over 5 sessions, as the dynamic sections figure
            client = await dsp.connect(h.sidecar.address, client_name=f"bench-cached-{s}")
            sessions.append(client)
            for shape, listener_count in shapes.items():
                scope = await client.scope(shape)
                for i in range(s * 2, s * 2 + 2):
                    await scope.section(
                        f"extra-{i:02d}", 1000 + i, _provider(i), cache=dsp.Cache.REVISION
                    )
                for i in range(listener_count // 5 + (s < listener_count % 5)):
                    await scope.on_assemble(
                        _noting_listener(f"note-{s}-{i}"), cache=dsp.Cache.REVISION
                    )
        samples = await interleaved(
            {"empty_rpc": probe.empty, **{shape: probe.assemble(shape) for shape in shapes}},
            iterations=h.budget.n(2000),
            warmup=h.budget.n(200),
        )
    finally:
        for client in sessions:
            await client.close()
        await probe.close()
    figures = []
    for shape, listener_count in shapes.items():
        value = ratio(samples[shape].p50, samples["empty_rpc"].p50)
        figures.append(
            Figure(
                key=shape,
                name=f"cacheable: 10 providers, {listener_count} listener(s), unchanged inputs"
                " / empty unary RPC",
                value=round(value, 2),
                unit=f"{X} p50",
                **at_most(value, 1.3),
                details={
                    **_timed_ratio_details({k: samples[k] for k in ("empty_rpc", shape)}),
                    "sessions": 5,
                    "policy": "Cache.REVISION on every provider and listener",
                },
            )
        )
    return figures


def _noting_listener(name: str) -> Callable[..., Awaitable[Any]]:
    async def note(assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any) -> Any:
        assembly.sections.append(dsp.AssembledSection(name, "Added before next()."))
        return next_()

    return note


def _over_static(
    samples: dict[str, Samples],
    key: str,
    name: str,
    words: str,
    limit: float,
    what: str = "the listener",
) -> Figure:
    """(p50 of `key` - p50 of the static assemble) in bidi round trips."""
    extra = samples[key].p50 - samples["static"].p50
    value = ratio(extra, samples["bidi_round_trip"].p50)
    return Figure(
        key=key,
        name=name,
        value=round(value, 2),
        unit="round trips",
        **at_most(value, limit, words),
        details={
            **_timed_ratio_details({k: samples[k] for k in ("static", key, "bidi_round_trip")}),
            "extra_us": _us(extra),
            "formula": f"(p50 {key} - p50 static) / p50 bidi_round_trip: the cost {what} "
            "add, in round trips",
            "baseline": "an empty message on a bare grpc.aio bidi echo server in its own "
            "process (bench/echo.py); the sidecar has no echo RPC",
        },
    )


async def throughput(h: Harness) -> list[Figure]:
    """8 clients, each on its own connection, as fast as they can: assemblies/s
    vs Health.Check/s, in alternating phases."""
    clients, rounds = 8, 3
    phase_s, warmup_s = h.budget.seconds(1.5), h.budget.seconds(0.5)
    probes = [Probe.open(h.sidecar.address, OWN_CONNECTION) for _ in range(clients)]
    operations: dict[str, list[Operation]] = {
        "assemble": [p.assemble() for p in probes],
        "empty_rpc": [p.empty for p in probes],
    }
    counts = {name: 0 for name in operations}
    sidecar_cpu = {name: 0.0 for name in operations}
    bench_cpu = {name: 0.0 for name in operations}
    try:
        for ops in operations.values():
            await _saturate(ops, warmup_s)
        for _ in range(rounds):
            for name, ops in operations.items():
                sidecar_before, bench_before = h.sidecar.cpu_seconds(), time.process_time()
                counts[name] += await _saturate(ops, phase_s)
                sidecar_cpu[name] += h.sidecar.cpu_seconds() - sidecar_before
                bench_cpu[name] += time.process_time() - bench_before
    finally:
        for probe in probes:
            await probe.close()
    elapsed = rounds * phase_s
    rates = {name: counts[name] / elapsed for name in operations}
    value = ratio(rates["assemble"], rates["empty_rpc"])
    return [
        Figure(
            key="throughput",
            name="8 concurrent clients: assemblies/s / empty RPCs/s",
            value=round(value, 2),
            unit=X,
            **at_least(value, 0.8),
            display=f"{value:.2f}{X} ({rates['assemble']:,.0f} vs {rates['empty_rpc']:,.0f}/s)",
            details={
                "assemblies_per_s": round(rates["assemble"]),
                "empty_rpcs_per_s": round(rates["empty_rpc"]),
                # Which process saturates: ~1.0 s of CPU per second is one full core.
                "sidecar_cpu_s_per_s": {
                    name: round(cpu / elapsed, 2) for name, cpu in sidecar_cpu.items()
                },
                "bench_cpu_s_per_s": {
                    name: round(cpu / elapsed, 2) for name, cpu in bench_cpu.items()
                },
                "sidecar_cpu_us_per_call": {
                    name: round(sidecar_cpu[name] / counts[name] * 1e6) for name in operations
                },
                # The same ratio from the sidecar's CPU per call: what it would be with the
                # sidecar saturated in both phases, less sensitive to other load on the host.
                "cpu_capacity_ratio": round(
                    ratio(
                        sidecar_cpu["empty_rpc"] / counts["empty_rpc"],
                        sidecar_cpu["assemble"] / counts["assemble"],
                    ),
                    2,
                ),
                "clients": clients,
                "phases": f"{rounds} phases of {phase_s:g} s per operation, alternating",
                "assemble": "Assemble with render: true, raw stub (no client-side decoding)",
                "note": "the 8 clients share the bench process; each has its own connection",
            },
        )
    ]


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
                samples = await interleaved(
                    {
                        "assemble_unix": over_unix.assemble(),
                        "assemble_tcp": over_tcp.assemble(),
                        "empty_rpc_unix": over_unix.empty,
                        "empty_rpc_tcp": over_tcp.empty,
                    },
                    iterations=h.budget.n(1000),
                    warmup=h.budget.n(100),
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
    return [
        Figure(
            key="unix_vs_tcp",
            name="static assemble over a unix socket / over loopback TCP",
            value=round(value, 3),
            unit=f"{X} p50",
            target="reported",
            met=None,
            display=f"{value:.3f}{X} p50 ({faster} {abs(1 - value) * 100:.1f} % faster)",
            details={
                **_timed_ratio_details(samples),
                "empty_rpc_ratio": round(empty, 2),
                "faster": faster,
                "difference_pct": round(abs(1 - value) * 100, 1),
            },
        )
    ]


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
    return [
        Figure(
            key="change_fan_out",
            name="change fan-out, 100 watchers, 1,000 registrations",
            value=round(latencies.p50 / 1e6, 2),
            unit="ms p50 delivery",
            target="all delivered",
            met=delivered == expected,
            display=f"{delivered:,}/{expected:,} delivered, p50 {latencies.p50 / 1e6:.1f} ms, "
            f"p99 {latencies.p99 / 1e6:.1f} ms",
            details={
                "delivered": delivered,
                "expected": expected,
                "missed_reported": missed,
                "latency_p50_ms": round(latencies.p50 / 1e6, 2),
                "latency_p99_ms": round(latencies.p99 / 1e6, 2),
                "registrations_s": round(registered_s, 2),
                "all_delivered_s": round(delivered_s, 2),
                "latency": "from the start of the RegisterSection call to the watcher "
                "reading the event; the 100 watchers run in the bench process (10 "
                "sessions, 10 streams each), so reading 100,000 events competes with "
                "registering",
            },
        )
    ]


async def idle_watchers(h: Harness) -> list[Figure]:
    """Registration p50 with 1,000 idle watchers, over the same with none."""
    count, registrations = 1000, h.budget.n(500)
    sidecar = await procs.start_sidecar(label="sidecar-idle-watchers")
    try:
        async with dsp.connect(sidecar.address, client_name="bench-registrar") as registrar:
            alone = await _registration_samples(registrar, registrations)
            watching = await procs.start_watchers(sidecar.address, count)
            try:
                watched = await _registration_samples(registrar, registrations)
            finally:
                await watching.stop()
    finally:
        await sidecar.stop()
    slowdown = watched.p50 / alone.p50
    return [
        Figure(
            key="idle_watchers",
            name="registration p50, 1,000 idle watchers / none",
            value=round(slowdown, 2),
            unit="x",
            target="≤ 3x",
            met=slowdown <= 3,
            display=f"{slowdown:.2f}x ({watched.p50 / 1e6:.2f} ms / {alone.p50 / 1e6:.2f} ms)",
            details={
                "without_watchers": alone.summary_us(),
                "with_watchers": watched.summary_us(),
                "watchers": count,
                "measured": "a section registered then disposed (two changes, each fanned "
                "out to every watcher); the watchers read in a process of their own",
            },
        )
    ]


async def _registration_samples(client: dsp.Client, count: int) -> Samples:
    durations = []
    for index in range(count):
        started = time.perf_counter_ns()
        dispose = await client.section(f"idle-{index}", index, "Registered under watch.")
        durations.append(time.perf_counter_ns() - started)
        await dispose()
    return Samples.of(durations)


async def _watch(
    stream: dsp.ChangeStream, expected: int, prefix: str
) -> tuple[dict[str, int], int]:
    received: dict[str, int] = {}
    missed = 0
    async for item in stream:
        now = time.perf_counter_ns()
        if isinstance(item, dsp.ChangesMissed):
            missed += item.count
        elif item.action == "registered" and item.name.startswith(prefix):
            received[item.name] = now
        if len(received) + missed >= expected:
            break
    return received, missed


MAX_GROWTH_PCT = 10  # the session_memory target


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
    return [
        Figure(
            key="session_memory",
            name=f"{cycles:,} session open → register → close cycles: RSS growth",
            value=round(growth, 1),
            unit="%",
            target=f"< {MAX_GROWTH_PCT} %, registry empty",
            met=growth < MAX_GROWTH_PCT and empty,
            display=f"{growth:+.1f} %, registry {'empty' if empty else 'NOT empty'}",
            details={
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
            },
        )
    ]


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
        held = _freed_by(lambda: setattr(sidecar.state, "responses", ResponseCache()))
        tracemalloc.stop()
        as_messages = _held_as_messages(await probe.raw_assemble("memo-000"), MESSAGE_COPIES)
    finally:
        await probe.close()
        await owner.close()
        await sidecar.server.stop(grace=None)
    per_scope, size = held / scopes, sum(encoded) / scopes
    value = ratio(per_scope, size)
    return [
        Figure(
            key="memo_memory",
            name="static memo per assembled scope / its encoded response",
            value=round(value, 3),
            unit=X,
            **at_most(value, 1.01, "≤ {:g} (the bytes, their header and key)"),
            details={
                "memo_bytes_per_scope": round(per_scope),
                "encoded_bytes_per_scope": round(size),
                "as_message_objects_bytes_per_scope": round(as_messages / MESSAGE_COPIES),
                "scopes": scopes,
                "method": "a sidecar in the bench process holding the realistic load; each of "
                f"{scopes} scopes assembled once (rendered); the memo's memory is what "
                "tracemalloc sees freed when the service's response cache is dropped; beside "
                "it, the RSS growth per parsed AssembleResponse object (what the memo held "
                f"before it held bytes), over {MESSAGE_COPIES} copies",
            },
        )
    ]


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


FigureFn = Callable[[Harness], Awaitable[list[Figure]]]

ALL: dict[str, FigureFn] = {
    "in_process": in_process,
    "grpc_assemble": grpc_assemble,
    "client_assemble": client_assemble,
    "ts_client_assemble": ts_client_assemble,
    "go_client_assemble": go_client_assemble,
    "many_scopes": many_scopes,
    "report_cost": report_cost,
    "dynamic_sections": dynamic_sections,
    "listeners": listeners,
    "cached_callbacks": cached_callbacks,
    "throughput": throughput,
    "unix_vs_tcp": unix_vs_tcp,
    "change_fan_out": change_fan_out,
    "idle_watchers": idle_watchers,
    "session_memory": session_memory,
    "memo_memory": memo_memory,
}


def collect_garbage() -> None:
    """Between figures: do not let one figure's garbage land in the next one's timings."""
    gc.collect()
