"""Limits: each with a clear error, nothing half-applied, the sidecar serving on."""

from __future__ import annotations

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import (
    ClientOf,
    SidecarFactory,
    eventually,
    raw_channel,
    raw_stub,
    rejection,
    section_names,
    tool,
)

SMALL = {
    "max_name_bytes": 16,
    "max_text_bytes": 64,
    "max_tool_schema_bytes": 128,
    "max_registrations_per_session": 5,
    "max_listeners": 2,
    "max_sessions": 2,
    "max_watchers": 1,
    "max_message_bytes": 4096,
}


@pytest.fixture
async def small(make_sidecar: SidecarFactory) -> Sidecar:
    return await make_sidecar(limits=SMALL)


async def test_a_name_over_the_limit_is_invalid_and_leaves_nothing(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        error = await rejection(client.section("n" * 17, 1, "x"))
        assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "VALUE_TOO_LARGE")
        assert error.message == "prompt section name is 17 bytes, over the limit of 16"
        assert len(small.registry.registrations(owner=client.session_id)) == 0


async def test_names_are_measured_in_utf8_bytes(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        error = await rejection(client.variable("é" * 9, "x"))
    assert "18 bytes, over the limit of 16" in str(error)


async def test_a_text_over_the_limit_is_invalid(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        error = await rejection(client.context("long", 1, "x" * 65))
        assert error.message == 'prompt context "long" text is 65 bytes, over the limit of 64'
        assert small.registry.changes.revision == 2  # only the built-ins ever registered


async def test_a_tool_schema_over_the_limit_is_invalid(small: Sidecar) -> None:
    big = dsp.ToolSchema("big", "d", {"type": "object", "description": "y" * 200})
    async with dsp.connect(small.address) as client:
        error = await rejection(client.tools([tool("ok"), big]))
        assert error.reason == "VALUE_TOO_LARGE"
        assert 'tool "big" schema is' in str(error)
        assert (await client.assemble()).tools == []


async def test_tool_parameters_must_be_a_json_object(client: dsp.Client) -> None:
    error = await rejection(client.tools([dsp.ToolSchema("t", "d", [1, 2])]))  # type: ignore[arg-type]
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JSON")
    assert error.message == 'tool "t" parameters must be a JSON object'


async def test_a_dynamic_answer_over_the_limit_fails_the_assembly(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        await client.section("grows", 1, lambda ctx: "z" * 100)
        error = await rejection(client.assemble())
    assert error.reason == "PROVIDER_FAILED"
    assert 'section provider "grows" (global) failed' in str(error)
    assert "over the limit of 64" in str(error)


async def test_registrations_per_session_are_a_quota(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        for index in range(5):
            await client.variable(f"v{index}", "x")
        error = await rejection(client.variable("v5", "x"))
        assert (error.code, error.reason) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
        )
        assert "5 registrations" in str(error)
        async with dsp.connect(small.address) as other:
            await other.variable("v5", "another session has its own quota")


async def test_sessions_are_a_quota(small: Sidecar) -> None:
    async with dsp.connect(small.address), dsp.connect(small.address):
        error = await rejection(dsp.connect(small.address))
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 sessions" in str(error)


async def test_listeners_are_a_quota(small: Sidecar) -> None:
    async def passthrough(assembly, ctx, next_):  # type: ignore[no-untyped-def]
        return next_()

    passthrough.__qualname__ = "short"  # labels obey the 16-byte name limit here too

    async with dsp.connect(small.address) as client:
        await client.on_assemble(passthrough)
        await client.on_assemble(passthrough)
        error = await rejection(client.on_assemble(passthrough))
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await client.assemble()


async def test_watchers_are_a_quota(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        first = await client.watch_changes()
        error = await rejection(client.watch_changes())
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await first.close()


async def test_a_message_over_the_size_limit_is_refused_and_the_sidecar_serves_on(
    small: Sidecar,
) -> None:
    async with dsp.connect(small.address) as client:
        error = await rejection(client.assemble(fields={"blob": "b" * 8192}))
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await client.section("after", 1, "still serving")
        assert "after" in section_names(await client.assemble())


# -- one connection cannot take every session --------------------------------------------


async def open_raw_session(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    """Open a session over `channel`'s one connection; the call fails if it is refused."""
    call = raw_stub(channel).OpenSession()
    await call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="flood")))
    reply = await call.read()
    assert reply is not grpc.aio.EOF and reply.HasField("opened")
    return call


async def test_one_connection_gets_at_most_max_sessions_per_peer_and_others_still_connect(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_sessions": 10, "max_sessions_per_peer": 3})
    async with raw_channel(sidecar.address) as flood:
        calls = [await open_raw_session(flood) for _ in range(3)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await open_raw_session(flood)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_sessions_per_peer" in (refused.value.details() or "")
        async with dsp.connect(sidecar.address) as agent:  # its own connection: admitted
            assert section_names(await agent.assemble(timeout=5))
        calls[0].cancel()
        await eventually(lambda: len(sidecar.state.sessions) == 3, "the cancelled session is gone")
        calls.append(await open_raw_session(flood))  # a closed session frees its slot
        for call in calls:
            call.cancel()


async def test_the_default_per_peer_limit_leaves_headroom_under_max_sessions(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar()
    limits = sidecar.config.state.limits
    assert limits.max_sessions_per_peer * 2 <= limits.max_sessions
    async with raw_channel(sidecar.address) as flood:
        calls = [await open_raw_session(flood) for _ in range(limits.max_sessions_per_peer)]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await open_raw_session(flood)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        async with dsp.connect(sidecar.address) as agent:
            assert section_names(await agent.assemble(timeout=5))
        for call in calls:
            call.cancel()


async def test_python_clients_in_one_process_each_have_their_own_connection(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_sessions_per_peer": 1})
    clients = [await dsp.connect(sidecar.address) for _ in range(3)]  # one peer each
    try:
        assert len(sidecar.state.sessions) == 3
    finally:
        for client in clients:
            await client.close()


async def test_a_client_name_over_the_name_limit_is_refused(small: Sidecar) -> None:
    error = await rejection(dsp.connect(small.address, client_name="c" * 17))
    assert (error.code, error.reason, error.message) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "VALUE_TOO_LARGE",
        "client name is 17 bytes, over the limit of 16",
    )
    assert len(small.state.sessions) == 0


async def test_an_assembly_scope_key_over_the_name_limit_is_refused(small: Sidecar) -> None:
    async with dsp.connect(small.address) as client:
        error = await rejection(client.assemble(scope="s" * 17))
        assert (error.code, error.reason, error.message) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "VALUE_TOO_LARGE",
            "scope name is 17 bytes, over the limit of 16",
        )


async def test_registered_values_share_a_total_budget(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar(limits={"max_total_bytes": 10_000})
    async with dsp.connect(sidecar.address) as client:
        first = await client.section("first", 1, "a" * 6_000)
        error = await rejection(client.section("second", 2, "b" * 6_000))
        assert (error.code, error.reason, error.message) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            "registered values would take 12000 bytes, over the sidecar's budget of 10000"
            " (limits.max_total_bytes)",
        )
        assert "second" not in section_names(await client.assemble())
        await first()
        await client.section("second", 2, "b" * 6_000)  # disposing gave the bytes back


async def test_an_assembly_too_large_to_send_fails_with_a_reason(
    client_of: ClientOf,
) -> None:
    async with client_of(limits={"max_message_bytes": 8192}) as client:
        for index in range(3):  # each registration fits in a message, the three together not
            await client.section(f"part-{index}", index, "p" * 3_000)
        error = await rejection(client.assemble())
        assert (error.code, error.reason) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "RESPONSE_TOO_LARGE",
        )
        assert "limits.max_message_bytes" in error.message
