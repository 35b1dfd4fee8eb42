"""Issue 34's attacks, run by `bench.attacks` beside the others: what a neighbour does
to the trust and fairness rules of the third round.

Unauthenticated, wrong-token, health and reflection floods (charged to no one before
#34), churn in the attacker's own scope (emptied everyone's caches), a provider answer
over the message bound (ended its whole session), a slow provider beside instant ones of
one session (ejected them all), a burst of assemblies with large provider answers through
one listener (closed it though it read), and plain watchers that fall behind a burst of
registrations (slowed the batched ones). Each loops until the deadline and counts what
the sidecar answered, like the attacks of `bench.attacks`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt._channel import _bearer_token
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from .attack_counts import Counts, tally

FLOOD_CALLERS = 4  # concurrent callers per flood
CHURN_PER_S = 50  # register/dispose pairs a second, as measured in #34
OVER_MESSAGE_BYTES = 5 * 1024 * 1024  # over the default max_message_bytes (4 MiB)
BURST = 150  # concurrent assemblies through one listener
BURST_ANSWER_BYTES = 240 * 1024
REGISTRATION_BURST = 1_500


async def _flood(until: float, call: Callable[[], Awaitable[None]]) -> None:
    loop = asyncio.get_running_loop()

    async def caller() -> None:
        while loop.time() < until:
            await call()

    await asyncio.gather(*(caller() for _ in range(FLOOD_CALLERS)))


async def credential_flood(address: str, token: str | None, counts: Counts, until: float) -> None:
    """Assemble calls with `token` (None: no credential at all), as fast as refused."""
    interceptors = [] if token is None else _bearer_token(token)
    name = "no-token flood" if token is None else "wrong-token flood"
    async with grpc.aio.insecure_channel(address, interceptors=interceptors) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        request = pb.AssembleRequest(context=pb.AssembleContext(scope="hostile-anonymous"))
        await _flood(until, lambda: tally(counts, name, stub.Assemble(request, timeout=5)))


async def health_flood(address: str, counts: Counts, until: float) -> None:
    """Health checks with no credential (health needs none)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest()
        await _flood(until, lambda: tally(counts, "health flood", stub.Check(request, timeout=5)))


async def reflection_flood(address: str, token: str | None, counts: Counts, until: float) -> None:
    """Reflection's service listing, with the attackers' credential where there is one."""
    interceptors = [] if token is None else _bearer_token(token)
    async with grpc.aio.insecure_channel(address, interceptors=interceptors) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def listing() -> None:
            call = stub.ServerReflectionInfo(timeout=5)
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            await call.done_writing()
            async for _ in call:
                pass

        await _flood(until, lambda: tally(counts, "reflection flood", listing()))


async def own_scope_churn(client: dsp.Client, counts: Counts, until: float) -> None:
    """Register and dispose a section in the attacker's own scope, CHURN_PER_S a second."""
    scope = await client.scope("hostile-churn")
    loop = asyncio.get_running_loop()
    index = 0
    while loop.time() < until:
        index += 1
        try:
            handle = await scope.section(f"churn-{index % 8}", 1, "x")
            await handle()
            counts["own-scope churn: pair"] += 1
        except dsp.SystemPromptError as error:
            counts[f"own-scope churn: {error.code.name} {error.reason}"] += 1
        await asyncio.sleep(1 / CHURN_PER_S)


async def oversized_answer(address: str, token: str | None, counts: Counts, until: float) -> None:
    """A tools provider whose answer is over the message bound, assembled in its scope."""
    async with dsp.connect(address, client_name="hostile-oversized", token=token) as client:
        scope = await client.scope("hostile-oversized")
        huge = [dsp.ToolSchema("t", "d" * OVER_MESSAGE_BYTES, {})]
        await scope.tools(lambda ctx: huge)
        while asyncio.get_running_loop().time() < until:
            await tally(
                counts, "oversized answer", client.assemble("hostile-oversized", timeout=10)
            )
            await asyncio.sleep(0.2)


async def slow_beside_instant(
    address: str, token: str | None, counts: Counts, until: float
) -> None:
    """One session's slow provider beside two instant ones, assembled in their scope."""
    async with dsp.connect(address, client_name="hostile-slow", token=token) as client:
        scope = await client.scope("hostile-slow")

        async def slow(ctx: dsp.AssembleContext) -> str:
            await asyncio.sleep(60)
            return "late"

        await scope.section("slow", 2, slow, failure_policy=dsp.FailurePolicy.IGNORE)
        await scope.section("instant", 1, lambda ctx: "now")
        await scope.variable("now", lambda ctx: "12:00")
        while asyncio.get_running_loop().time() < until:
            await tally(counts, "slow provider", client.assemble("hostile-slow", timeout=15))


async def passing(
    assembly: dsp.PromptAssembly,
    ctx: dsp.AssembleContext,
    next_: Callable[[], Awaitable[dsp.PromptAssembly]],
) -> Any:
    """A listener that passes every assembly on unchanged."""
    return await next_()


async def listener_burst(client: dsp.Client, counts: Counts, until: float) -> None:
    """BURST concurrent assemblies whose provider answers BURST_ANSWER_BYTES, through one
    listener of their scope that answers at once."""
    scope = await client.scope("hostile-burst")
    await scope.section("wide", 1, lambda ctx: "w" * BURST_ANSWER_BYTES)

    await scope.on_assemble(passing)
    while asyncio.get_running_loop().time() < until:
        calls = (
            tally(counts, "listener burst", client.assemble("hostile-burst", {"i": i}, timeout=15))
            for i in range(BURST)
        )
        await asyncio.gather(*calls)


async def watchers_behind_a_burst(
    stub: pb_grpc.SystemPromptServiceStub, client: dsp.Client, counts: Counts, until: float
) -> list[Any]:
    """Plain watchers that read one event a second, then a burst of registrations."""
    held: list[Any] = []
    for _ in range(64):
        call = stub.WatchChanges(pb.WatchChangesRequest())
        try:
            await call.read()
        except grpc.aio.AioRpcError as error:
            counts[f"slow watcher: {error.code().name}"] += 1
            break
        held.append(call)
        counts["slow watcher: subscribed"] += 1
    readers = [asyncio.create_task(_slow_reader(call, counts)) for call in held]
    scope = await client.scope("hostile-registrations")
    for index in range(REGISTRATION_BURST):
        await tally(counts, "registration burst", scope.section(f"r-{index}", 1, "r"))
    await asyncio.sleep(max(0.0, until - asyncio.get_running_loop().time()))
    for reader in readers:
        reader.cancel()
    return held


async def _slow_reader(call: Any, counts: Counts) -> None:
    try:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            if message.WhichOneof("kind") == "missed":
                counts["slow watcher: told it missed events"] += 1
            await asyncio.sleep(1)
    except grpc.aio.AioRpcError as error:
        counts[f"slow watcher: ended {error.code().name}"] += 1
