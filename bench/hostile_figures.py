"""Issue 22's memory findings 2-5, each alone against a fresh sidecar: its RSS before, at
its peak and after, against the memory budget (`bench.hostile` reports them).

    python -m bench.hostile_figures [--budget-mib 512]

These are figures, not checks: a finding's bound is its test's (tests/hostile/test_hostile_*.py);
here is what the process takes, which Python's allocator and gRPC's buffers add to.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from . import procs
from .attacks import BIG_PART, FIELDS_BYTES, OWN_CONNECTION

MIB = 1024 * 1024
Scenario = Callable[[str], Awaitable[None]]


async def _big_layer(client: dsp.Client, key: str, parts: int = 14) -> None:
    """`parts` x 250 KiB in scope `key` (14: 3.5 MiB)."""
    layer = await client.scope(key)
    for index in range(parts):
        await layer.section(f"big-{index}", 900 + index, chr(ord("a") + index % 26) * BIG_PART)


async def scopes_300(address: str) -> None:
    """3.5 MiB registered, assembled in each of 300 scopes that inherit it."""
    async with dsp.connect(address, client_name="figures") as client:
        await _big_layer(client, "big")
        for index in range(300):
            await client.scope(f"big-{index}", parent="big")
            await client.assemble(scope=f"big-{index}", timeout=30)


async def cacheable_callbacks(address: str) -> None:
    """A cacheable provider asked with 400 distinct fields_json of the largest size allowed
    (max_fields_bytes), answering the largest text allowed (max_text_bytes)."""
    async with dsp.connect(address, client_name="figures") as client:
        answer = "a" * (BIG_PART - 16)

        def provide(context: dsp.AssembleContext) -> str:
            return f"{context.get('n'):>8}{answer}"

        scope = await client.scope("cacheable")
        await scope.section("dynamic", 1, provide, cache=dsp.Cache.FIELDS)
        pad = "p" * (FIELDS_BYTES - 64)
        for index in range(400):
            await client.assemble(scope="cacheable", fields={"n": index, "pad": pad}, timeout=30)


async def unread_listings(address: str) -> None:
    """64 MiB registered; 10 listings with values that read one batch and stop."""
    async with dsp.connect(address, client_name="figures") as client:
        for layer in range(18):  # 18 x 3.5 MiB
            await _big_layer(client, f"listed-{layer}")
        async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as channel:
            stub = pb_grpc.SystemPromptServiceStub(channel)
            calls = [
                stub.ListRegistrations(pb.ListRegistrationsRequest(include_values=True))
                for _ in range(10)
            ]
            for call in calls:
                await call.read()
            await asyncio.sleep(3)  # held, unread, for most of provider_timeout_s
            for call in calls:
                call.cancel()


async def prompt_watchers(address: str) -> None:
    """256 WatchPrompt streams of a 3.5 MiB scope that read one message and stop, while
    the scope changes 20 times."""
    async with dsp.connect(address, client_name="figures") as client:
        await _big_layer(client, "watched")
        async with contextlib.AsyncExitStack() as stack:
            calls = []
            for _ in range(4):  # 64 a connection: the per-connection watch quota
                channel = await stack.enter_async_context(
                    grpc.aio.insecure_channel(address, options=OWN_CONNECTION)
                )
                stub = pb_grpc.SystemPromptServiceStub(channel)
                for _ in range(64):
                    call = stub.WatchPrompt(pb.WatchPromptRequest(scope="watched"))
                    await call.read()
                    calls.append(call)
            watched = await client.scope("watched")
            for index in range(20):
                await watched.section(f"change-{index}", 1, "changed")
                await asyncio.sleep(0.2)
            for call in calls:
                call.cancel()


SCENARIOS: dict[str, Scenario] = {
    "300_scopes_of_3_5_mib": scopes_300,
    "cacheable_callbacks_largest_fields": cacheable_callbacks,
    "10_unread_listings_of_64_mib": unread_listings,
    "256_prompt_watchers_of_3_5_mib": prompt_watchers,
}


async def figure(name: str, scenario: Scenario, budget_mib: int) -> dict[str, Any]:
    """One scenario against a fresh sidecar (the defaults: the budget as documented)."""
    sidecar = await procs.start_sidecar(label=f"figure-{name}")
    try:
        before = peak = sidecar.rss_kib()
        work = asyncio.ensure_future(scenario(sidecar.address))
        while not work.done():
            peak = max(peak, sidecar.rss_kib())
            await asyncio.wait({work}, timeout=0.2)
        await work
        after = sidecar.rss_kib()
    finally:
        await sidecar.stop()
    return {
        "rss_before_mib": round(before / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_after_mib": round(after / 1024, 1),
        "under_budget": peak / 1024 <= budget_mib,
    }


async def figures(budget_mib: int) -> dict[str, Any]:
    return {name: await figure(name, run, budget_mib) for name, run in SCENARIOS.items()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile_figures", description=__doc__)
    parser.add_argument("--budget-mib", type=int, default=512)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(figures(args.budget_mib)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
