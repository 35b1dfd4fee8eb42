"""A listener's `off()` disposes it through its own stream: half-closed, the sidecar
disposes it and ends the stream with OK, so no Dispose follows (it was refused NOT_FOUND
when the stream's cancel had disposed it first), and once `off()` returns no assembly
sees the listener."""

from __future__ import annotations

import contextlib
from typing import Any

import dsh_system_prompt as dsp
import grpc
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, eventually, listener_streams, marking, section_names

ROUNDS = 20


class Disposes:
    """The Dispose calls a client makes, and the status of each the sidecar refused."""

    def __init__(self, client: dsp.Client) -> None:
        stub = client._connection.stub
        self._rpc = stub.Dispose
        self.calls = 0
        self.refused: list[grpc.StatusCode] = []
        stub.Dispose = self

    async def __call__(self, request: Any, **options: Any) -> Any:
        self.calls += 1
        try:
            return await self._rpc(request, **options)
        except grpc.RpcError as error:
            self.refused.append(error.code())
            raise


async def test_off_sends_no_dispose_after_the_stream_s_end_disposed_the_listener(
    client: dsp.Client,
) -> None:
    disposes = Disposes(client)
    scope = await client.scope("agent")
    for registrar in [client, scope]:
        off = await registrar.on_assemble(marking)
        assert "mark" in section_names(await client.assemble(scope="agent"))
        await off()
    assert (disposes.calls, disposes.refused) == (0, [])
    off_section = await client.section("plain", 1, "text")
    await off_section()  # a registration without a stream of its own: one Dispose
    assert (disposes.calls, disposes.refused) == (1, [])


async def test_once_off_returns_no_assembly_sees_the_listener(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    owner, assembler = await connect(), await connect()
    for _ in range(ROUNDS):
        off = await owner.on_assemble(marking)
        assert "mark" in section_names(await assembler.assemble())
        await off()
        assert listener_streams(sidecar) == []
        assert "mark" not in section_names(await assembler.assemble())


async def test_a_listener_may_call_its_own_off(sidecar: Sidecar, connect: ClientFactory) -> None:
    owner, assembler = await connect(), await connect()
    returned: list[str] = []

    async def once(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Any) -> object:
        try:
            await off()  # the stream's end cancels this invocation: off() still returns
        except BaseException as error:
            returned.append(repr(error))
            raise
        returned.append("returned")
        return await next_()

    disposes = Disposes(owner)
    off = await owner.on_assemble(once)
    with contextlib.suppress(dsp.SystemPromptError):  # its stream ended under this assembly
        await assembler.assemble()
    await eventually(lambda: returned != [], "off() returns or raises")
    assert returned == ["returned"]
    assert disposes.refused == []
    assert listener_streams(sidecar) == []
    await assembler.assemble()  # without it, and without failing
