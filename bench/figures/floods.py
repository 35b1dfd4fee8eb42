"""Calls that carry no valid credential, against an honest client's (issue 34, item 5): with
credentials configured, what a flood of Assembles without a token or with a wrong one, of
health checks or of reflection costs a credentialed client beside it."""

from __future__ import annotations

import asyncio
import secrets
import tempfile
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from .. import floods, procs
from ..report import Figure
from ..stats import Samples, Stopwatch
from ..targets import TARGETS
from .build import slowdown
from .harness import Harness

SECTIONS = 10
SETTLE_S = 1.0  # after the flood's first answers, before timing: its shares are measured
NAMES = {
    "no_token": "Assembles without a token",
    "wrong_token": "Assembles with a wrong token",
    "health": "health checks",
    "reflection": "reflection's list of services",
}


async def floods_beside(h: Harness) -> list[Figure]:
    """A credentialed client's Assemble p50 under each flood of `bench.floods`, over the same
    client's calm p50 measured just before and just after it, in one sidecar."""
    count = h.budget.n(300)
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="dsp-floods-") as folder:
        path = Path(folder) / "honest.token"
        path.write_text(token + "\n")
        credential = {
            "name": "honest",
            "role": "agent",
            "scopes": ["*"],
            "global": True,
            "token_file": str(path),
        }
        sidecar = await procs.start_sidecar(
            config={"credentials": [credential]}, label="sidecar-floods"
        )
        try:
            async with dsp.connect(sidecar.address, client_name="honest", token=token) as owner:
                scope = await owner.scope(floods.SCOPE)
                for index in range(SECTIONS):
                    await scope.section(f"s-{index}", index, f"Section {index}. " * 20)
                calms, flooded = await _timings(sidecar.address, token, count)
        finally:
            await sidecar.stop()
    figures = []
    for index, kind in enumerate(floods.FLOODS):
        calm = (calms[index].p50 + calms[index + 1].p50) / 2
        details: dict[str, Any] = {
            "calm_before": calms[index].summary_us(),
            f"with_{kind}": flooded[index].summary_us(),
            "calm_after": calms[index + 1].summary_us(),
            "flood": f"{floods.CONNECTIONS} connections x {floods.IN_FLIGHT} calls in flight"
            " from a process of its own, each sent again once answered",
            "client": "one credentialed client: Assemble of a 10-section scope, rendered,"
            " one call every 5 ms",
        }
        figures.append(
            slowdown(
                f"flood_{kind}",
                f"Credentialed Assemble p50, a flood of {NAMES[kind]} / calm",
                flooded[index].p50,
                calm,
                TARGETS[f"flood_{kind}"],
                details,
            )
        )
    return figures


async def _timings(address: str, token: str, count: int) -> tuple[list[Samples], list[Samples]]:
    """Calm, then each flood, then calm again: calm before every flood and after the last."""
    metadata = (("authorization", f"Bearer {token}"),)
    request = pb.AssembleRequest(context=pb.AssembleContext(scope=floods.SCOPE), render=True)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)

        async def timed() -> Samples:
            stopwatch = Stopwatch()
            for _ in range(count):
                await stopwatch.timed(lambda: stub.Assemble(request, metadata=metadata))
                await asyncio.sleep(0.005)  # a caller among others, not a flood
            return stopwatch.samples()

        await timed()  # warm: connection, caches
        calms, flooded = [await timed()], []
        for kind in floods.FLOODS:
            flood = await procs.start_flood(address, kind)
            try:
                await asyncio.sleep(SETTLE_S)
                flooded.append(await timed())
            finally:
                await flood.stop()
            calms.append(await timed())
    return calms, flooded
