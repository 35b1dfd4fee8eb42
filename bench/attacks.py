"""Hostile peers, every attack of issues 11, 22 and 34 at once, in their own process.

    python -m bench.attacks ADDRESS SECONDS [SKIP,...]

Each attack loops until the deadline and counts what the sidecar answered;
the counts go to stdout as one JSON object. Nothing here is expected to
succeed: the point is what the well-behaved clients beside it see.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt._channel import _bearer_token

from . import trust_attacks as trust
from .attack_counts import Counts, answered, tally

Stub = pb_grpc.SystemPromptServiceStub
OWN_CONNECTION = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", 1 << 24),
]
WATCHERS = 1_000
DEEP = 100_000
# The attackers' credential, when the sidecar has credentials (`bench.hostile --credentials`):
# every channel presents it, so the sidecar counts them all as one client.
TOKEN = os.environ.get("DSP_HOSTILE_TOKEN") or None


def _channel(address: str, options: Any = None) -> grpc.aio.Channel:
    """A channel to the sidecar, presenting the attackers' credential when there is one."""
    interceptors = [] if TOKEN is None else _bearer_token(TOKEN)  # the client's own
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)


def _nested(depth: int) -> str:
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


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
    try:
        installed = await listen.read()  # then never read again
        counts[f"stalled listener: {installed.WhichOneof('kind')}"] += 1
    except grpc.aio.AioRpcError as error:
        counts[f"stalled listener: {error.code().name} {error.details()[:60]}"] += 1
    return [session, listen]


async def stuck_listener(stub: Stub, counts: Counts) -> list[Any]:
    """A global listener that reads every invocation and never answers one: ejected
    after its one timeout (issue 22, finding 1)."""
    session, session_id = await _raw_session(stub)
    listen = stub.Listen()
    await listen.write(pb.ListenRequest(start=pb.ListenStart(session_id=session_id, name="stuck")))

    async def read_all() -> None:
        try:
            while (message := await listen.read()) is not grpc.aio.EOF:
                counts[f"stuck listener: {message.WhichOneof('kind')}"] += 1
        except grpc.aio.AioRpcError as error:
            counts[f"stuck listener: {error.code().name} {error.details()[:60]}"] += 1

    return [session, listen, asyncio.create_task(read_all())]


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
        await tally(counts, "stalled session assemble", stub.Assemble(request, timeout=2))
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
        await tally(counts, "huge scope key", stub.Assemble(request, timeout=5))


async def deep_json(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub, counts: Counts, until: float
) -> None:
    loop = asyncio.get_running_loop()
    fields = pb.AssembleRequest(context=pb.AssembleContext(fields_json=_nested(DEEP)))
    while loop.time() < until:
        await tally(counts, "deep fields", stub.Assemble(fields, timeout=5))
        tool = dsp.ToolSchema.from_json("deep", "d", _nested(DEEP))
        await tally(counts, "deep tool parameters", client.tools([tool]))


async def session_flood(address: str, counts: Counts, until: float) -> list[Any]:
    """One connection opens sessions until refused, and keeps them."""
    channel = _channel(address)
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
        await tally(counts, "malformed template", client.section(f"bad-{index}", 1, "{{ x }}"))
        await asyncio.sleep(0.01)


async def idle_watchers(stub: pb_grpc.SystemPromptServiceStub, counts: Counts) -> list[Any]:
    """Watchers that subscribe and never read another event, on one connection: as many
    as one client may hold (max_watchers_per_peer), of the 1,000 asked."""
    calls = []
    for _ in range(WATCHERS):
        call = stub.WatchChanges(pb.WatchChangesRequest())
        if not await answered(call, counts, "idle watcher", "subscribed"):
            break
        calls.append(call)
    return calls


async def loud_provider_and_deep_waterfall(
    client: dsp.Client, counts: Counts, until: float
) -> None:
    """In its own scope: a 20 KB provider error, and listeners that all call next(): as many
    as one client may hold (max_listeners_per_peer), of the 400 asked."""
    scope = await client.scope("hostile-loud")

    def loud(ctx: dsp.AssembleContext) -> str:
        raise RuntimeError("x" * 20_000)

    await scope.section("loud", 1, loud)
    waterfall = await client.scope("hostile-waterfall")

    loop = asyncio.get_running_loop()
    installed, refused = 0, False
    while loop.time() < until:
        await tally(counts, "loud provider", client.assemble(scope="hostile-loud", timeout=5))
        for _ in range(0 if refused else min(50, 400 - installed)):  # grows while assembled
            try:
                await waterfall.on_assemble(trust.passing)
            except dsp.SystemPromptError as error:  # past the client's listener quota
                counts[f"chained listener: {error.code.name} {error.reason}"] += 1
                refused = True
                break
            installed += 1
        await tally(
            counts,
            f"{installed} chained listeners",
            client.assemble(scope="hostile-waterfall", timeout=10),
        )


BIG_PART = 250 * 1024  # under max_text_bytes: 14 of them are a 3.5 MiB scope
FIELDS_BYTES = 64 * 1024  # max_fields_bytes: the largest fields the bounds allow
LIST_ITEMS = 1024  # max_list_items


async def big_scopes(stub: Stub, counts: Counts, until: float) -> list[Any]:
    """3.5 MiB registered once, assembled in 300 opened scopes (a response per scope).

    In a layer of its own that the 300 scopes inherit: registered globally, it would be
    in every well-behaved client's prompt too, a cost the registry's bounds allow."""
    session, session_id = await _raw_session(stub)
    layer = await stub.OpenScope(pb.OpenScopeRequest(session_id=session_id, key="hostile-big"))
    for index in range(14):
        request = pb.RegisterSectionRequest(
            session_id=session_id,
            scope_id=layer.scope_id,
            name=f"big-{index}",
            order=900 + index,
            text=chr(ord("a") + index) * BIG_PART,
        )
        await tally(counts, "big scopes: register", stub.RegisterSection(request))
    loop = asyncio.get_running_loop()
    index = 0
    while loop.time() < until:
        key = f"hostile-big-{index % 300}"
        index += 1
        opening = pb.OpenScopeRequest(session_id=session_id, key=key, parent_key="hostile-big")
        await stub.OpenScope(opening)
        assemble = pb.AssembleRequest(context=pb.AssembleContext(scope=key))
        await tally(counts, "big scopes: assemble", stub.Assemble(assemble, timeout=10))
    return [session]


def _largest_fields(index: int) -> str:
    """Valid fields as large and as deep as the bounds allow, new each time."""
    head = '{"a":' * 60
    pad = max(0, FIELDS_BYTES - len(head) * 2 - 64)
    return head + json.dumps({"n": index, "pad": "p" * pad}) + "}" * 60


async def largest_requests(stub: Stub, counts: Counts, until: float) -> list[Any]:
    """The largest requests the bounds allow, again and again: fields, filters, invalidations."""
    session, _ = await _raw_session(stub)
    kinds = [pb.CHANGE_KIND_SECTION] * LIST_ITEMS
    invalidate = pb.CacheInvalidate(provider_keys=[f"k{i}" for i in range(LIST_ITEMS)])
    loop = asyncio.get_running_loop()
    index = 0
    while loop.time() < until:
        index += 1
        context = pb.AssembleContext(scope="hostile-fields", fields_json=_largest_fields(index))
        request = pb.AssembleRequest(context=context)
        await tally(counts, "largest fields", stub.Assemble(request, timeout=10))
        listing = pb.ListRegistrationsRequest(filter=pb.ChangeFilter(kinds=kinds))
        await tally(counts, "largest filter", _drain(stub.ListRegistrations(listing)))
        invalidate.invalidate_id = index
        await session.write(pb.OpenSessionRequest(invalidate=invalidate))
    return [session]


async def _after(seconds: float, work: Awaitable[list[Any]]) -> list[Any]:
    await asyncio.sleep(seconds)
    return await work


async def _drain(call: Any) -> None:
    async for _ in call:
        pass


async def unread_listings(stub: Stub, counts: Counts) -> list[Any]:
    """Ten listings with values that read one batch and stop."""
    calls = []
    for _ in range(10):
        call = stub.ListRegistrations(pb.ListRegistrationsRequest(include_values=True))
        await answered(call, counts, "unread listing", "started")
        calls.append(call)
    return calls


async def prompt_watchers(address: str, counts: Counts) -> list[Any]:
    """256 WatchPrompt streams of one 3.5 MiB scope, on four connections of 64."""
    held: list[Any] = []
    for _ in range(4):
        channel = _channel(address, options=OWN_CONNECTION)
        held.append(channel)
        stub = pb_grpc.SystemPromptServiceStub(channel)
        for _ in range(64):
            call = stub.WatchPrompt(pb.WatchPromptRequest(scope="hostile-big-0"))
            await answered(call, counts, "prompt watcher", "watching")
            held.append(call)
    return held


async def idle_connections(address: str, counts: Counts) -> list[Any]:
    """1,100 TCP connections that never send a byte (no token needed)."""
    if address.startswith("unix:"):
        return []
    host, _, port = address.rpartition(":")
    held = []
    for _ in range(1100):
        try:
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        except OSError as error:
            counts[f"idle connection: {type(error).__name__}"] += 1
            break
        held.append(writer)
        counts["idle connection: opened"] += 1
    return held


async def quota_hog(address: str, counts: Counts, until: float) -> list[Any]:
    """One connection opens watches until refused, and keeps them."""
    channel = _channel(address, options=OWN_CONNECTION)
    stub = pb_grpc.SystemPromptServiceStub(channel)
    held: list[Any] = [channel]
    while asyncio.get_running_loop().time() < until:
        call = stub.WatchChanges(pb.WatchChangesRequest())
        if not await answered(call, counts, "quota hog watch", "opened"):
            break
        held.append(call)
    return held


ATTACKS = (
    "idle-watchers",
    "stalled-listener",
    "stuck-listener",
    "stalled-session",
    "huge-scope-keys",
    "deep-json",
    "session-flood",
    "malformed-templates",
    "loud-provider",
    "big-scopes",
    "largest-requests",
    "unread-listings",
    "prompt-watchers",
    "idle-connections",
    "quota-hog",
    # issue 34
    "no-token-flood",
    "wrong-token-flood",
    "health-flood",
    "reflection-flood",
    "own-scope-churn",
    "oversized-answer",
    "slow-provider",
    "listener-burst",
    "watchers-behind-a-burst",
)


async def attack(address: str, seconds: float, skip: frozenset[str] = frozenset()) -> Counts:
    counts: Counts = collections.Counter()
    until = asyncio.get_running_loop().time() + seconds
    channel = _channel(address)
    stub = pb_grpc.SystemPromptServiceStub(channel)
    client = await dsp.connect(address, client_name="hostile", token=TOKEN)
    held: list[Any] = []
    try:
        if "idle-watchers" not in skip:
            held += await idle_watchers(stub, counts)
        if "stalled-listener" not in skip:
            held += await stalled_listener(stub, counts)
        if "stuck-listener" not in skip:
            held += await stuck_listener(stub, counts)
        if "idle-connections" not in skip:
            held += await idle_connections(address, counts)
        running: dict[str, Callable[[], Awaitable[object]]] = {
            "stalled-session": lambda: stalled_session(stub, counts, until),
            "huge-scope-keys": lambda: huge_scope_keys(stub, counts, until),
            "deep-json": lambda: deep_json(client, stub, counts, until),
            "session-flood": lambda: session_flood(address, counts, until),
            "malformed-templates": lambda: malformed_templates(client, counts, until),
            "loud-provider": lambda: loud_provider_and_deep_waterfall(client, counts, until),
            "big-scopes": lambda: big_scopes(stub, counts, until),
            "largest-requests": lambda: largest_requests(stub, counts, until),
            "quota-hog": lambda: quota_hog(address, counts, until),
            **_trust_attacks(address, stub, client, counts, until),
            # after the big scope is registered: they list and watch it
            "unread-listings": lambda: _after(5, unread_listings(stub, counts)),
            "prompt-watchers": lambda: _after(5, prompt_watchers(address, counts)),
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
            elif isinstance(call, asyncio.StreamWriter):
                call.close()
            else:
                await call.close()
        await client.close()
        await channel.close()
    return counts


def _trust_attacks(
    address: str, stub: Stub, client: dsp.Client, counts: Counts, until: float
) -> dict[str, Callable[[], Awaitable[object]]]:
    """Issue 34's attacks (bench.trust_attacks), by name."""
    return {
        "no-token-flood": lambda: trust.credential_flood(address, None, counts, until),
        "wrong-token-flood": lambda: trust.credential_flood(address, "wrong", counts, until),
        "health-flood": lambda: trust.health_flood(address, counts, until),
        "reflection-flood": lambda: trust.reflection_flood(address, TOKEN, counts, until),
        "own-scope-churn": lambda: trust.own_scope_churn(client, counts, until),
        "oversized-answer": lambda: trust.oversized_answer(address, TOKEN, counts, until),
        "slow-provider": lambda: trust.slow_beside_instant(address, TOKEN, counts, until),
        "listener-burst": lambda: trust.listener_burst(client, counts, until),
        "watchers-behind-a-burst": lambda: trust.watchers_behind_a_burst(
            stub, client, counts, until
        ),
    }


def main() -> int:
    address, seconds = sys.argv[1], float(sys.argv[2])
    skip = frozenset(sys.argv[3].split(",")) if len(sys.argv) > 3 else frozenset()
    counts = asyncio.run(attack(address, seconds, skip))
    print(json.dumps(dict(sorted(counts.items())), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
