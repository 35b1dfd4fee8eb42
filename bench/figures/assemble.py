"""What one assemble costs: in process, over gRPC, and through each client, against
an empty unary RPC on the same sidecar."""

from __future__ import annotations

import time

import dsh_system_prompt as dsp
from dsh_system_prompt_server import Registry, RegistrySettings
from dsh_system_prompt_server.registry import AssembleContext

from .. import golang, node, workload
from ..report import Figure, below
from ..stats import Samples
from .harness import Harness, Probe, p50_ratio


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
        samples = await h.timed({"assemble": probe.assemble(), "empty_rpc": probe.empty}, 2000)
    finally:
        await probe.close()
    return [
        p50_ratio(
            samples,
            "assemble",
            "empty_rpc",
            1.3,
            key="grpc_assemble",
            name="gRPC Assemble (static, rendered) / empty unary RPC",
            details={
                "baseline": "grpc.health.v1.Health/Check on the same channel",
            },
        )
    ]


async def client_assemble(h: Harness) -> list[Figure]:
    """The Python client's assemble() into its own objects vs Health.Check."""
    client = await dsp.connect(h.sidecar.address, client_name="bench-client")
    probe = Probe.open(h.sidecar.address)
    try:
        samples = await h.timed(
            {"client_assemble": client.assemble, "empty_rpc": probe.empty}, 2000
        )
    finally:
        await client.close()
        await probe.close()
    return [
        p50_ratio(
            samples,
            "client_assemble",
            "empty_rpc",
            1.2,
            key="client_assemble",
            name="client assemble() end to end / empty unary RPC",
            details={
                "baseline": "grpc.health.v1.Health/Check from the same process, on a channel "
                "of its own to the same sidecar",
            },
        )
    ]


async def ts_client_assemble(h: Harness) -> list[Figure]:
    """The TypeScript client's assemble() vs Health.Check, both from one Node process."""
    iterations, warmup = h.budget.n(2000), h.budget.n(200)
    measured = await node.run_bench("assemble.js", h.sidecar.address, iterations, warmup)
    samples = {name: Samples.of(measured[name]) for name in ("client_assemble", "empty_rpc")}
    return [
        p50_ratio(
            samples,
            "client_assemble",
            "empty_rpc",
            1.6,
            key="ts_client_assemble",
            name="TypeScript client assemble() / empty unary RPC (Node)",
            details={
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
    return [
        p50_ratio(
            samples,
            "client_assemble",
            "empty_rpc",
            1.3,
            key="go_client_assemble",
            name="Go client Assemble / empty unary RPC (Go)",
            details={
                "go": measured["go"],
                "baseline": "grpc.health.v1.Health/Check from the same Go process, on a "
                "channel of its own to the same sidecar",
            },
        )
    ]
