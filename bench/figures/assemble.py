"""What one assemble costs: in process, over gRPC, and through each client, against
an empty unary RPC on the same sidecar."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_server import Registry, RegistrySettings
from dsh_system_prompt_server.registry import AssembleContext

from .. import golang, node, workload
from ..report import Figure, below
from ..stats import Samples
from ..targets import TARGETS
from .build import figure, p50_ratio
from .harness import Harness, Probe


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
    details = {
        "load": h.load.describe(),
        "total": total.summary_us(),
        "assemble": Samples.of(assemble_ns).summary_us(),
        "render": Samples.of(render_ns).summary_us(),
    }
    name = "in-process assemble + render (realistic load)"
    judged = below(p50, TARGETS["in_process"], "p50 < {:g} µs")
    return [figure("in_process", name, p50, "µs p50", judged, details, digits=1)]


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
            TARGETS["grpc_assemble"],
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
            TARGETS["client_assemble"],
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
    name = "TypeScript client assemble() / empty unary RPC (Node)"
    return [await _other_runtime(h, _node_assemble, "Node", "ts_client_assemble", name)]


async def go_client_assemble(h: Harness) -> list[Figure]:
    """The Go client's Assemble vs Health.Check, both from one Go process."""
    name = "Go client Assemble / empty unary RPC (Go)"
    return [await _other_runtime(h, _go_assemble, "Go", "go_client_assemble", name)]


Run = Callable[[str, int, int], Awaitable[dict[str, Any]]]


async def _node_assemble(address: str, iterations: int, warmup: int) -> dict[str, Any]:
    return await node.run_bench("assemble.js", address, iterations, warmup)


async def _go_assemble(address: str, iterations: int, warmup: int) -> dict[str, Any]:
    return await golang.run_json(address, str(iterations), str(warmup))


async def _other_runtime(h: Harness, run: Run, runtime: str, key: str, name: str) -> Figure:
    """A client in another language times its assemble and Health.Check side by side in
    its own process (`run`, given the sidecar, the iterations and the warm-up); the
    figure is their p50 ratio, at most its target."""
    measured = await run(h.sidecar.address, h.budget.n(2000), h.budget.n(200))
    samples = {op: Samples.of(measured[op]) for op in ("client_assemble", "empty_rpc")}
    details = {
        runtime.lower(): measured[runtime.lower()],
        "baseline": f"grpc.health.v1.Health/Check from the same {runtime} process, on a "
        "channel of its own to the same sidecar",
    }
    return p50_ratio(
        samples,
        "client_assemble",
        "empty_rpc",
        TARGETS[key],
        key=key,
        name=name,
        details=details,
    )
