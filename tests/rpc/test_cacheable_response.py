"""AssembleResponse.cacheable says whether a plan is all-static: only then may a
client keep the answer until the registry's revision changes."""

from __future__ import annotations

import dsh_system_prompt as dsp
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc


async def cacheable(stub: pb_grpc.SystemPromptServiceStub, **request: bool) -> bool:
    reply: pb.AssembleResponse = await stub.Assemble(pb.AssembleRequest(**request))
    return reply.cacheable


async def test_an_all_static_plan_is_cacheable_rendered_or_reported(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    await client.section("role", 10, "Be brief.")
    assert await cacheable(stub)
    assert await cacheable(stub)  # and when answered from the sidecar's own memo
    assert await cacheable(stub, render=True)
    assert await cacheable(stub, report=True)


async def test_a_dynamic_part_makes_the_plan_not_cacheable(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    await client.section("clock", 10, lambda ctx: "now")
    assert not await cacheable(stub)


async def test_a_cacheable_provider_still_makes_the_plan_not_cacheable(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    await client.section("clock", 10, lambda ctx: "now", cache=dsp.Cache.REVISION)
    assert not await cacheable(stub)
    assert not await cacheable(stub)


async def test_a_listener_makes_the_plan_not_cacheable(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    async def listener(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
    ) -> dsp.PromptAssembly:
        return await next()

    await client.on_assemble(listener)
    assert not await cacheable(stub)
