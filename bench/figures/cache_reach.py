"""Caches keyed by reach (issue 34, item 6): alice's figures while bob churns in his own
scope, 50 register/dispose pairs a second under the parent scope they share. Her
cacheable provider (`Cache.REVISION`) is asked once in 300 assemblies, and her local
cache answers at least 95 % of her assemblies of a static scope without a call: bob's
changes are in no layer her assemblies read. (On the code before, where every cache was
keyed by the registry's one revision, the issue measured 262-280 calls and 16-23 %.)"""

from __future__ import annotations

import asyncio
import contextlib

import dsh_system_prompt as dsp

from ..report import Figure, at_least, at_most
from ..targets import TARGETS
from .build import figure
from .harness import Harness

CHURN_PER_S = 50.0  # bob's register/dispose pairs a second
PACE_S = 0.01  # between alice's assemblies: 300 of them span ~3 s, ~150 of bob's pairs


async def cache_reach(h: Harness) -> list[Figure]:
    address = h.sidecar.address
    alice = await dsp.connect(address, client_name="bench-alice")
    caching = await dsp.connect(address, client_name="bench-alice-cache", local_cache=True)
    bob = await dsp.connect(address, client_name="bench-bob")
    assemblies = h.budget.n(300)
    asked = 0

    def answer(context: dsp.AssembleContext) -> str:
        nonlocal asked
        asked += 1
        return "alice's answer"

    try:
        await alice.scope("reach-team")
        mine = await alice.scope("reach-alice", parent="reach-team")
        await mine.section("rules", 10, "alice's rules")
        dynamic = await alice.scope("reach-alice-dynamic", parent="reach-team")
        await dynamic.section("answer", 20, answer, cache=dsp.Cache.REVISION)
        his = await bob.scope("reach-bob", parent="reach-team")
        churn = _Churn(his)
        task = asyncio.create_task(churn.run())
        local = caching._connection.local  # the counts of the client's local cache
        assert local is not None
        answered, calls = local.answered, local.asked
        try:
            await asyncio.sleep(0.2)  # bob is churning before alice starts
            for _ in range(assemblies):
                await alice.assemble("reach-alice-dynamic")
                await caching.assemble("reach-alice")
                await asyncio.sleep(PACE_S)
        finally:
            churn.stop = True
            with contextlib.suppress(asyncio.CancelledError):
                await task
        local_answers = local.answered - answered
        local_calls = local.asked - calls
    finally:
        for client in (alice, caching, bob):
            await client.close()
    share = 100.0 * local_answers / max(1, local_answers + local_calls)
    details = {
        "assemblies": assemblies,
        "bob_pairs": churn.pairs,
        "bob_pairs_per_s": round(churn.pairs / max(churn.seconds, 1e-9), 1),
        "local_answers": local_answers,
        "local_calls": local_calls,
    }
    calls_limit = TARGETS["cache_reach_provider_calls"]
    share_limit = TARGETS["cache_reach_local_answers"]
    return [
        figure(
            "cache_reach_provider_calls",
            f"alice's cacheable provider while bob churns (calls in {assemblies} assemblies)",
            asked,
            "calls",
            at_most(asked, calls_limit),
            details,
            digits=0,
        ),
        figure(
            "cache_reach_local_answers",
            "alice's local cache while bob churns (answers without a call)",
            share,
            "%",
            at_least(share, share_limit, "≥ {:g} %"),
            details,
            digits=1,
        ),
    ]


class _Churn:
    """bob's register/dispose pairs in his own scope, paced at CHURN_PER_S."""

    def __init__(self, scope: dsp.Scope) -> None:
        self._scope = scope
        self.pairs = 0
        self.seconds = 0.0
        self.stop = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while not self.stop:
            handle = await self._scope.section("churn", 5, "bob's")
            await handle()
            self.pairs += 1
            delay = start + self.pairs / CHURN_PER_S - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        self.seconds = loop.time() - start
