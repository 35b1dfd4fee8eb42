"""A bounded soak test: N clients register, assemble and churn against one sidecar.

    python -m bench.soak [--clients 8] [--seconds 60]     (or `make soak`)

Every client loops: open a scope, register static and dynamic sections, a
variable, tools and a listener, assemble (global and scoped), dispose some,
and now and then close its session and connect anew. Only planned failures
are allowed (none are planned); the sidecar's RSS is sampled, and at the end
the registry must be back to its two built-in sections. Exit 1 on any problem.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import dsh_system_prompt as dsp

from . import procs

BUILT_INS = ["harness:identity", "deployment:persona"]


@dataclass
class Tally:
    assemblies: int = 0
    registrations: int = 0
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds per assemble call


async def churn(
    address: str,
    index: int,
    deadline: float,
    tally: Tally,
    pace_s: float = 0.0,
    token: str | None = None,
) -> None:
    """One client's loop until `deadline` (event-loop time), `pace_s` between its turns,
    presenting `token` (a credential of its own) when the sidecar has credentials."""
    loop = asyncio.get_running_loop()
    rng = random.Random(index)
    client = await dsp.connect(address, client_name=f"soak-{index}", token=token)
    round_ = 0
    try:
        while loop.time() < deadline:
            round_ += 1
            try:
                await one_round(client, index, round_, rng, tally, pace_s)
            except dsp.SystemPromptError as error:
                tally.errors.append(f"client {index} round {round_}: {error.code.name}: {error}")
            if rng.random() < 0.1:  # a fresh session now and then
                await client.close()
                client = await dsp.connect(address, client_name=f"soak-{index}", token=token)
                tally.reconnects += 1
    finally:
        await client.close()


async def one_round(
    client: dsp.Client,
    index: int,
    round_: int,
    rng: random.Random,
    tally: Tally,
    pace_s: float = 0.0,
) -> None:
    scope = await client.scope(f"agent-{index}-{round_ % 5}", parent=f"team-{index % 3}")
    offs: list[dsp.Disposer] = [
        await client.section(f"c{index}-static-{round_}", index * 100 + 1, "static"),
        await scope.section(f"c{index}-dynamic", 2, lambda ctx: f"turn {ctx.get('turn')}"),
        await scope.variable("turn_note", lambda ctx: str(ctx.get("turn"))),
        await client.tools([dsp.ToolSchema(f"c{index}-tool-{round_}", "d", {"type": "object"})]),
    ]

    async def tag(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Any) -> Any:
        assembly.variables["soak"] = "1"
        return next_()

    offs.append(await scope.on_assemble(tag))
    tally.registrations += len(offs) + 1
    try:
        for turn in range(rng.randint(1, 5)):
            for scoped in (scope.key, None):
                started = time.perf_counter()
                await client.assemble(scope=scoped, fields={"turn": turn}, timeout=10)
                tally.latencies.append(time.perf_counter() - started)
            tally.assemblies += 2
            if pace_s:
                await asyncio.sleep(pace_s)  # an agent's turn: the model answers in between
        for off in rng.sample(offs, k=rng.randint(0, len(offs))):
            await off()
    finally:
        # also after a failed assembly: the scope's key comes back five rounds later, and
        # what it left registered would refuse the same names (DUPLICATE_NAME)
        await scope.dispose()


async def soak(clients: int, seconds: float) -> dict[str, Any]:
    sidecar = await procs.start_sidecar(label="soak")
    try:
        loop = asyncio.get_running_loop()
        tally = Tally()
        rss_start = sidecar.rss_kib()
        deadline = loop.time() + seconds
        samples: list[int] = []

        async def sample_memory() -> None:
            while loop.time() < deadline:
                samples.append(sidecar.rss_kib())
                await asyncio.sleep(max(1.0, seconds / 20))

        started = time.perf_counter()
        await asyncio.gather(
            sample_memory(), *(churn(sidecar.address, i, deadline, tally) for i in range(clients))
        )
        elapsed = time.perf_counter() - started
        async with dsp.connect(sidecar.address, client_name="soak-check") as check:
            final = await check.assemble(timeout=10)
        leftover = [s.name for s in final.sections if s.name not in BUILT_INS]
        half = samples[len(samples) // 2 :] or [rss_start]
        growth_pct = round(100 * (max(half) - half[0]) / half[0], 1)
        report = {
            "clients": clients,
            "seconds": round(elapsed, 1),
            "assemblies": tally.assemblies,
            "assemblies_per_s": round(tally.assemblies / elapsed),
            "registrations": tally.registrations,
            "reconnects": tally.reconnects,
            "unexpected_errors": len(tally.errors),
            "first_errors": tally.errors[:5],
            "rss_kib": {"start": rss_start, "mid": half[0], "end": samples[-1] if samples else 0},
            "rss_growth_second_half_pct": growth_pct,
            "leftover_sections": leftover,
            "leftover_tools": [t.name for t in final.tools],
        }
        report["ok"] = not tally.errors and not leftover and not final.tools and growth_pct < 10
        return report
    finally:
        await sidecar.stop()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    report = asyncio.run(soak(args.clients, args.seconds))
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
