"""The wire protocol as a client in another language sees it: versions, features, tool slots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import RawListener, raw_channel, raw_listener, raw_stub, tool_names

TOOLS = [dsp.ToolSchema(name, f"the {name} tool", {"type": "object"}) for name in ("a", "b")]


@asynccontextmanager
async def invoked(
    sidecar: Sidecar, client: dsp.Client, *features: str
) -> AsyncIterator[tuple[RawListener, asyncio.Future[dsp.PromptAssembly], pb.ListenerInvocation]]:
    """A raw listener with `features`, invoked by an assembly of `client` (its tools TOOLS)."""
    await client.tools(TOOLS)
    async with raw_listener(sidecar, *features) as listener:
        assembling, invocation = await listener.invoked_by(client)
        yield listener, assembling, invocation


async def test_a_session_learns_the_sidecars_version(sidecar: Sidecar) -> None:
    async with raw_channel(sidecar.address) as channel:
        session = raw_stub(channel).OpenSession()
        start = pb.SessionStart(client_name="raw", client_version="go-client/1.0", features=["x"])
        await session.write(pb.OpenSessionRequest(start=start))
        opened = (await session.read()).opened
        session.cancel()
    assert opened.sidecar_version.startswith("dsh-system-prompt/")
    assert list(opened.features) == []  # no session feature is defined; unknown ones are ignored


async def test_a_listener_gets_only_the_features_both_sides_support(sidecar: Sidecar) -> None:
    async with raw_listener(sidecar, "tool-slots", "from-the-future") as listener:
        assert list(listener.registered.features) == ["tool-slots"]


async def test_a_listener_that_declares_no_feature_gets_every_tool_in_full(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with invoked(sidecar, client) as (listener, assembling, invocation):
        assert list(listener.registered.features) == []
        slots = list(range(len(invocation.assembly.tools)))  # slots in a reply are always fine
        next_result = await listener.call_next(invocation, slots)
        assert list(next_result.tool_slots) == []
        assert [t.name for t in next_result.assembly.tools] == ["a", "b"]
        # The naive listener hands back what next() returned, as it is: no tool is lost.
        await listener.reply(invocation, assembly=next_result.assembly)
        assert tool_names(await assembling) == ["a", "b"]


async def test_a_listener_that_decodes_slots_gets_unchanged_tools_as_slots(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with invoked(sidecar, client, "tool-slots") as (listener, assembling, invocation):
        next_result = await listener.call_next(invocation, [0, 1])
        assert list(next_result.tool_slots) == [0, 1]
        assert list(next_result.assembly.tools) == []
        await listener.reply(
            invocation, assembly=next_result.assembly, tool_slots=next_result.tool_slots
        )
        assert tool_names(await assembling) == ["a", "b"]


async def test_a_reply_with_a_slot_out_of_range_fails_that_listener(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with invoked(sidecar, client, "tool-slots") as (listener, assembling, invocation):
        await listener.reply(invocation, tool_slots=[0, 7])
        with pytest.raises(dsp.SystemPromptError) as failure:
            await assembling
    assert (failure.value.code, failure.value.reason) == (
        grpc.StatusCode.ABORTED,
        dsp.Reason.LISTENER_FAILED,
    )
    assert 'listener "raw" failed: tool slot 7 is out of range' in failure.value.message


async def test_fresh_tools_that_do_not_match_the_minus_one_slots_are_rejected(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with invoked(sidecar, client) as (listener, assembling, invocation):
        # Two new tools announced by the slots, one sent.
        fresh = pb.PromptAssembly(tools=[pb.ToolSchema(name="c", parameters_json="{}")])
        await listener.reply(invocation, assembly=fresh, tool_slots=[-1, -1])
        with pytest.raises(dsp.SystemPromptError) as failure:
            await assembling
    assert failure.value.reason == dsp.Reason.LISTENER_FAILED
    assert "more -1 tool slots than tools sent" in failure.value.message


async def register_dynamic_section(
    stub: pb_grpc.SystemPromptServiceStub, session_id: str, name: str, key: str
) -> pb.RegisterSectionResponse:
    request = pb.RegisterSectionRequest(
        session_id=session_id, name=name, order=1, dynamic=pb.Dynamic(provider_key=key)
    )
    return await stub.RegisterSection(request)


async def test_a_provider_key_in_use_in_the_session_is_already_exists(sidecar: Sidecar) -> None:
    async with raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        session = stub.OpenSession()
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="raw")))
        session_id = (await session.read()).opened.session_id
        first = await register_dynamic_section(stub, session_id, "one", "k1")
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await register_dynamic_section(stub, session_id, "two", "k1")
        names = [e.name for e in sidecar.registry.registrations() if e.owner == session_id]
        await stub.Dispose(
            pb.DisposeRequest(session_id=session_id, registration_id=first.registration_id)
        )
        reused = await register_dynamic_section(stub, session_id, "two", "k1")
        session.cancel()
    assert failure.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert dict(failure.value.trailing_metadata())["dsh-error-reason"] == "DUPLICATE_PROVIDER_KEY"
    assert 'provider key "k1" is already in use' in str(failure.value.details())
    assert names == ["one"]  # the refused registration left nothing behind
    assert reused.registration_id


async def test_two_sessions_may_use_the_same_provider_key(sidecar: Sidecar) -> None:
    async with raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        registered = []
        streams = []
        for index in range(2):
            session = stub.OpenSession()
            await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="raw")))
            session_id = (await session.read()).opened.session_id
            streams.append(session)
            registered.append(await register_dynamic_section(stub, session_id, f"s{index}", "k1"))
        for session in streams:
            session.cancel()
    assert all(r.registration_id for r in registered)
