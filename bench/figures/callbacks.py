"""Client-side callables: dynamic sections, waterfall listeners and cacheable callbacks,
in bidi round trips over the static assemble (or against the empty RPC)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp

from ..report import Figure
from ..stats import Samples
from ..targets import TARGETS
from .build import p50_ratio, round_trips
from .harness import Harness, Probe


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
        samples = await h.timed_with_round_trip(
            {
                "static": probe.assemble("static-10"),
                "dynamic_1_session": probe.assemble("dynamic-1-session"),
                "dynamic_5_sessions": probe.assemble("dynamic-5-sessions"),
            },
            1000,
        )
    finally:
        await static.dispose()
        for client in sessions:
            await client.close()
        await probe.close()
    return [
        over_static(samples, key, label, "≤ static + {:g} round trips", "dynamic sections")
        for key, label in (
            ("dynamic_1_session", "10 dynamic sections, 1 session"),
            ("dynamic_5_sessions", "10 dynamic sections, 5 sessions"),
        )
    ]


def _provider(index: int) -> Callable[[dsp.AssembleContext], str]:
    def provide(context: dsp.AssembleContext) -> str:
        return f"Extra section {index}, dynamic."

    return provide


CHAIN = 4  # listeners in the chained figure's scope


async def listeners(h: Harness) -> list[Figure]:
    """One waterfall listener that only works before next(), and one that
    post-processes next()'s result, vs the static assemble without one; and a chain
    of `CHAIN` such listeners, per listener past the first."""
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
        chained = await client.scope("listener-chain")
        for i in range(CHAIN):
            await chained.on_assemble(_noting_listener(f"listener:note-{i}"))
        samples = await h.timed_with_round_trip(
            {
                "static": probe.assemble(),
                "before_next": probe.assemble("listener-before"),
                "post_processing": probe.assemble("listener-after"),
                "chained": probe.assemble("listener-chain"),
            },
            1000,
        )
    finally:
        await client.close()
        await probe.close()
    return [
        over_static(samples, "before_next", "listener, before next() only", "≤ {:g} round trips"),
        over_static(
            samples, "post_processing", "listener, with post-processing", "≤ {:g} round trips"
        ),
        further_listener(samples),
    ]


def further_listener(samples: dict[str, Samples]) -> Figure:
    """What each listener past the first of a chain adds, in bidi round trips."""
    extra = (samples["chained"].p50 - samples["before_next"].p50) / (CHAIN - 1)
    timings = {k: samples[k] for k in ("before_next", "chained", "bidi_round_trip")}
    formula = (
        f"(p50 chained - p50 before_next) / {CHAIN - 1} / p50 bidi_round_trip: a chain of "
        f"{CHAIN} listeners that work before next(), each listener past the first, in round trips"
    )
    name, words = "each further chained listener", "≤ {:g} round trips"
    limit = TARGETS["further_listener"]
    return round_trips("further_listener", name, extra, timings, limit, words, {"formula": formula})


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
        samples = await h.timed(
            {"empty_rpc": probe.empty, **{shape: probe.assemble(shape) for shape in shapes}}, 2000
        )
    finally:
        for client in sessions:
            await client.close()
        await probe.close()
    return [
        p50_ratio(
            {k: samples[k] for k in ("empty_rpc", shape)},
            shape,
            "empty_rpc",
            TARGETS[shape],
            key=shape,
            name=f"cacheable: 10 providers, {listener_count} listener(s), unchanged inputs"
            " / empty unary RPC",
            details={"sessions": 5, "policy": "Cache.REVISION on every provider and listener"},
        )
        for shape, listener_count in shapes.items()
    ]


def _noting_listener(name: str) -> Callable[..., Awaitable[Any]]:
    async def note(assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any) -> Any:
        assembly.sections.append(dsp.AssembledSection(name, "Added before next()."))
        return next_()

    return note


def over_static(
    samples: dict[str, Samples],
    key: str,
    name: str,
    words: str,
    what: str = "the listener",
) -> Figure:
    """(p50 of `key` - p50 of the static assemble) in bidi round trips."""
    extra = samples[key].p50 - samples["static"].p50
    details = {
        "formula": f"(p50 {key} - p50 static) / p50 bidi_round_trip: the cost {what} "
        "add, in round trips",
        "baseline": "an empty message on a bare grpc.aio bidi echo server in its own "
        "process (bench/echo.py); the sidecar has no echo RPC",
    }
    timings = {k: samples[k] for k in ("static", key, "bidi_round_trip")}
    return round_trips(key, name, extra, timings, TARGETS[key], words, details)
