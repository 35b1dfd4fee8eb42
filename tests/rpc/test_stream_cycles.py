"""What a stream leaves when it ends, and what a failed assembly leaves, is freed at once:
nothing of it waits in a reference cycle for the garbage collector, whose full collections
(tens of thousands of objects in the hostile soak) pause every call on the loop."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, garbage_left

SERVER = "dsh_system_prompt_server."
# an ended listener stream's own objects, and the last assembly it was handed
STREAM_KINDS = {"ListenerStream", "Outbox", "Replies", "Reference", "Assembly", "Part"}
# an assembly's waterfall through a listener
WATERFALL_KINDS = {"_Waterfall", "ListenerInvocation", "Budget", "Skips", "_Cached", "Origin"}


async def left_for_collector(work: Callable[[], Awaitable[object]]) -> set[str]:
    """The sidecar's kinds of object that `work` left in reference cycles (the client runs
    in this process too: its own are left out)."""
    return {type(thing).__name__ for thing in await garbage_left(work) if _sidecars(thing)}


def _sidecars(thing: object) -> bool:
    module = type(thing).__module__
    return module.startswith(SERVER) or module.endswith("system_prompt_pb2")


async def passing(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
) -> dsp.PromptAssembly:
    return await next_(assembly)


async def failing(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
) -> dsp.PromptAssembly:
    raise RuntimeError("no")


async def with_sections(client: dsp.Client) -> dsp.Client:
    """`client`, its sidecar's assemblies holding 20 sections of its."""
    for index in range(20):
        await client.section(f"part-{index}", index, f"Part {index}.")
    return client


async def test_an_ended_listener_stream_leaves_nothing_for_the_collector(
    client: dsp.Client,
) -> None:
    await with_sections(client)

    async def listen_then_dispose() -> None:
        for _ in range(3):
            off = await client.on_assemble(passing)
            for _ in range(3):
                await client.assemble()
            await off()
            await client.assemble()  # a plan without it: nothing else holds its stream

    assert not await left_for_collector(listen_then_dispose) & STREAM_KINDS


async def test_an_ended_session_stream_leaves_nothing_for_the_collector(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async def connect_then_close() -> None:
        for _ in range(3):
            async with dsp.connect(sidecar.address) as other:
                await other.assemble()

    assert "Session" not in await left_for_collector(connect_then_close)


async def test_an_assembly_a_listener_failed_leaves_none_of_its_waterfall_for_the_collector(
    connect: ClientFactory,
) -> None:
    client = await with_sections(await connect())
    await client.on_assemble(failing)

    async def fail() -> None:
        for _ in range(3):
            with pytest.raises(dsp.SystemPromptError):
                await client.assemble()

    assert not await left_for_collector(fail) & WATERFALL_KINDS
