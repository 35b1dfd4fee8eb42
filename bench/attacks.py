"""Hostile peers, every attack of issue 11 at once, in their own process (`bench.hostile`).

    python -m bench.attacks ADDRESS SECONDS [SKIP,...]

Each attack loops until the deadline and counts what the sidecar answered;
the counts go to stdout as one JSON object. Nothing here is expected to
succeed: the point is what the well-behaved clients beside it see.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

Counts = collections.Counter[str]
WATCHERS = 1_000
DEEP = 100_000


def _nested(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


async def _tally(counts: Counts, name: str, call: Awaitable[object]) -> None:
    try:
        await call
        counts[f"{name}: ok"] += 1
    except grpc.aio.AioRpcError as error:
        counts[f"{name}: {error.code().name}"] += 1
    except dsp.SystemPromptError as error:
        counts[f"{name}: {error.code.name} {error.reason}"] += 1


async def _raw_session(stub: pb_grpc.SystemPromptServiceStub) -> tuple[Any, str]:
    """A session whose stream is never read again after it opened."""
    call = stub.OpenSession()
    await call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="hostile")))
    opened = await call.read()
    return call, opened.opened.session_id


async def stalled_listener(stub: pb_grpc.SystemPromptServiceStub, counts: Counts) -> list[Any]:
    """A global listener whose client stops reading: every assembly invokes it."""
    session, session_id = await _raw_session(stub)
    listen = stub.Listen()
    await listen.write(pb.ListenRequest(start=pb.ListenStart(session_id=session_id, name="stall")))
    counts["stalled listener: installed"] += 1
    return [session, listen]


async def stalled_session(
    stub: pb_grpc.SystemPromptServiceStub, counts: Counts, until: float
) -> list[Any]:
    """A session that never reads, with a provider its own assemblies need, asked with
    3 MiB fields again and again: its outbox is all that grows."""
    session, session_id = await _raw_session(stub)
    scope = await stub.OpenScope(pb.OpenScopeRequest(session_id=session_id, key="hostile-stall"))
    await stub.RegisterSection(
        pb.RegisterSectionRequest(
            session_id=session_id,
            scope_id=scope.scope_id,
            name="s",
            order=1,
            dynamic=pb.Dynamic(provider_key="s"),
        )
    )
    fields = json.dumps({"blob": "x" * (3 * 1024 * 1024)})
    request = pb.AssembleRequest(
        context=pb.AssembleContext(scope="hostile-stall", fields_json=fields)
    )
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        await _tally(counts, "stalled session assemble", stub.Assemble(request, timeout=2))
    return [session]


async def huge_scope_keys(
    stub: pb_grpc.SystemPromptServiceStub, counts: Counts, until: float
) -> None:
    loop = asyncio.get_running_loop()
    index = 0
    while loop.time() < until:
        index += 1
        key = f"{index}-" + "k" * 1_000_000
        request = pb.AssembleRequest(context=pb.AssembleContext(scope=key))
        await _tally(counts, "huge scope key", stub.Assemble(request, timeout=5))


async def deep_json(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub, counts: Counts, until: float
) -> None:
    loop = asyncio.get_running_loop()
    fields = pb.AssembleRequest(context=pb.AssembleContext(fields_json=_nested(DEEP)))
    while loop.time() < until:
        await _tally(counts, "deep fields", stub.Assemble(fields, timeout=5))
        tool = dsp.ToolSchema.from_json("deep", "d", _nested(DEEP))
        await _tally(counts, "deep tool parameters", client.tools([tool]))


async def session_flood(address: str, counts: Counts, until: float) -> list[Any]:
    """One connection opens sessions until refused, and keeps them."""
    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.SystemPromptServiceStub(channel)
    held: list[Any] = [channel]
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        try:
            call, _ = await _raw_session(stub)
        except grpc.aio.AioRpcError as error:
            counts[f"session flood: {error.code().name}"] += 1
            break
        held.append(call)
        counts["session flood: opened"] += 1
    return held


async def malformed_templates(client: dsp.Client, counts: Counts, until: float) -> None:
    loop = asyncio.get_running_loop()
    index = 0
    while loop.time() < until:
        index += 1
        await _tally(counts, "malformed template", client.section(f"bad-{index}", 1, "{{ x }}"))
        await asyncio.sleep(0.01)


async def idle_watchers(stub: pb_grpc.SystemPromptServiceStub, counts: Counts) -> list[Any]:
    """Watchers that subscribe and never read another event."""
    calls = []
    for _ in range(WATCHERS):
        call = stub.WatchChanges(pb.WatchChangesRequest())
        try:
            await call.read()
        except grpc.aio.AioRpcError as error:
            counts[f"idle watcher: {error.code().name}"] += 1
            break
        calls.append(call)
        counts["idle watcher: subscribed"] += 1
    return calls


async def loud_provider_and_deep_waterfall(
    client: dsp.Client, counts: Counts, until: float
) -> None:
    """In its own scope: a 20 KB provider error, and 400 listeners that all call next()."""
    scope = await client.scope("hostile-loud")

    def loud(ctx: dsp.AssembleContext) -> str:
        raise RuntimeError("x" * 20_000)

    await scope.section("loud", 1, loud)
    waterfall = await client.scope("hostile-waterfall")

    async def passing(
        assembly: dsp.PromptAssembly,
        ctx: dsp.AssembleContext,
        next_: Callable[[], Awaitable[dsp.PromptAssembly]],
    ) -> Any:
        return await next_()

    loop = asyncio.get_running_loop()
    installed = 0
    while loop.time() < until:
        await _tally(counts, "loud provider", client.assemble(scope="hostile-loud", timeout=5))
        for _ in range(min(50, 400 - installed)):  # the chain grows while it is assembled
            await waterfall.on_assemble(passing)
            installed += 1
        await _tally(
            counts,
            f"{installed} chained listeners",
            client.assemble(scope="hostile-waterfall", timeout=10),
        )


ATTACKS = (
    "idle-watchers",
    "stalled-listener",
    "stalled-session",
    "huge-scope-keys",
    "deep-json",
    "session-flood",
    "malformed-templates",
    "loud-provider",
)


async def attack(address: str, seconds: float, skip: frozenset[str] = frozenset()) -> Counts:
    counts: Counts = collections.Counter()
    until = asyncio.get_running_loop().time() + seconds
    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.SystemPromptServiceStub(channel)
    client = await dsp.connect(address, client_name="hostile")
    held: list[Any] = []
    try:
        if "idle-watchers" not in skip:
            held += await idle_watchers(stub, counts)
        if "stalled-listener" not in skip:
            held += await stalled_listener(stub, counts)
        running = {
            "stalled-session": lambda: stalled_session(stub, counts, until),
            "huge-scope-keys": lambda: huge_scope_keys(stub, counts, until),
            "deep-json": lambda: deep_json(client, stub, counts, until),
            "session-flood": lambda: session_flood(address, counts, until),
            "malformed-templates": lambda: malformed_templates(client, counts, until),
            "loud-provider": lambda: loud_provider_and_deep_waterfall(client, counts, until),
        }
        results = await asyncio.gather(
            *(start() for name, start in running.items() if name not in skip),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                counts[f"attack crashed: {type(result).__name__}: {str(result)[:80]}"] += 1
            elif isinstance(result, list):
                held += result
        await asyncio.sleep(max(0.0, until - asyncio.get_running_loop().time()))
    finally:
        for call in held:
            if hasattr(call, "cancel"):
                call.cancel()
            else:
                await call.close()
        await client.close()
        await channel.close()
    return counts


def main() -> int:
    address, seconds = sys.argv[1], float(sys.argv[2])
    skip = frozenset(sys.argv[3].split(",")) if len(sys.argv) > 3 else frozenset()
    counts = asyncio.run(attack(address, seconds, skip))
    print(json.dumps(dict(sorted(counts.items())), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
