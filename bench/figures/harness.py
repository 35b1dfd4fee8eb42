"""What the figures share: the iteration budget, the harness (the load, a sidecar
serving it, the echo server), raw probes, fresh sidecars and a timing beside a helper
process."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .. import procs, workload
from ..echo import EchoStream
from ..stats import Operation, Samples, interleaved

BUILTIN_SECTIONS = {"harness:identity", dsp.PERSONA_SECTION}
ASSEMBLE_METHOD = "/dsh.systemprompt.v1.SystemPromptService/Assemble"
# Each "client" of the throughput figure gets its own connection: channels in one
# process otherwise share one subchannel (one TCP connection) per target.
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

    async def timed(
        self, operations: Mapping[str, Operation], iterations: int
    ) -> dict[str, Samples]:
        """`operations` timed side by side (`stats.interleaved`): `iterations` rounds after a
        tenth as many untimed, both scaled by the budget."""
        return await interleaved(
            operations, iterations=self.budget.n(iterations), warmup=self.budget.n(iterations // 10)
        )

    async def timed_with_round_trip(
        self, operations: Mapping[str, Operation], iterations: int
    ) -> dict[str, Samples]:
        """As `timed`, with a bidi round trip on the echo server (`bidi_round_trip`) last."""
        async with echo_stream(self.echo.address) as echo:
            return await self.timed({**operations, "bidi_round_trip": echo.round_trip}, iterations)


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


async def beside_a_process(
    timed: Callable[[], Awaitable[Samples]], start: Callable[[], Awaitable[procs.ServerProcess]]
) -> tuple[Samples, Samples]:
    """`timed()` alone, then again with the process `start()` gives running beside it."""
    alone = await timed()
    process = await start()
    try:
        return alone, await timed()
    finally:
        await process.stop()


async def gather_limited(jobs: list[Awaitable[Any]], limit: int) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def run(job: Awaitable[Any]) -> Any:
        async with semaphore:
            return await job

    return await asyncio.gather(*(run(job) for job in jobs))


def collect_garbage() -> None:
    """Between figures: do not let one figure's garbage land in the next one's timings."""
    gc.collect()
