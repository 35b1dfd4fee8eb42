"""Hostile input gets the right error: deep JSON is INVALID_JSON, long messages are cut, bytes
that are no request are INVALID_VALUE."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.wire.handlers import SERVICE
from dsh_system_prompt_server.wire.json_text import MAX_JSON_DEPTH
from dsh_system_prompt_server.wire.status import MAX_MESSAGE_BYTES
from helpers import SidecarFactory, failure, raw_channel, raw_stub, refusal, rejection, tool_names

Next = Callable[..., Awaitable[dsp.PromptAssembly]]
TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels"


def nested(depth: int) -> str:
    """A JSON object `depth` levels deep: {"a": {"a": ... {} ...}}."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def deep_tool(depth: int = 100_000) -> dsp.ToolSchema:
    return dsp.ToolSchema.from_json("deep", "d", nested(depth))


# -- JSON nesting -----------------------------------------------------------------------


async def test_assemble_fields_nested_10000_deep_are_invalid_json(sidecar: Sidecar) -> None:
    # 10,000 levels fit max_fields_bytes (60 KB); 100,000 would be VALUE_TOO_LARGE
    request = pb.AssembleRequest(context=pb.AssembleContext(fields_json=nested(10_000)))
    async with raw_channel(sidecar.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw_stub(channel).Assemble(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == f"assemble fields are not valid JSON here: {TOO_DEEP}"


async def test_tool_parameters_nested_100000_deep_are_invalid_json(client: dsp.Client) -> None:
    error = await rejection(client.tools([deep_tool()]))
    assert failure(error) == refusal(
        "INVALID_JSON", f'tool "deep" parameters are not valid JSON here: {TOO_DEEP}'
    )


async def test_tool_parameters_one_level_past_the_limit_are_invalid_json(
    client: dsp.Client,
) -> None:
    error = await rejection(client.tools([deep_tool(MAX_JSON_DEPTH + 1)]))
    assert error.reason == "INVALID_JSON"
    assert TOO_DEEP in error.message


async def test_tool_parameters_at_the_limit_are_accepted(client: dsp.Client) -> None:
    await client.tools([deep_tool(MAX_JSON_DEPTH)])
    assert tool_names(await client.assemble()) == ["deep"]


async def test_deep_tool_parameters_from_a_provider_fail_that_provider(
    client: dsp.Client,
) -> None:
    await client.tools(lambda ctx: [deep_tool()])
    error = await rejection(client.assemble(timeout=10))
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "PROVIDER_FAILED")
    assert TOO_DEEP in error.message


async def test_deep_tool_parameters_from_a_listener_fail_that_listener(
    client: dsp.Client,
) -> None:
    async def deepen(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.tools.append(deep_tool())
        return await next_()

    await client.on_assemble(deepen)
    error = await rejection(client.assemble(timeout=10))
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "LISTENER_FAILED")
    assert TOO_DEEP in error.message


# -- messages that quote unbounded data -------------------------------------------------


async def test_a_20kb_provider_error_arrives_cut_with_its_reason(client: dsp.Client) -> None:
    def explode(ctx: dsp.AssembleContext) -> str:
        raise RuntimeError("boom " + "x" * 20_000)

    await client.section("loud", 1, explode)
    error = await rejection(client.assemble(timeout=10))
    assert (error.code, error.reason) == (grpc.StatusCode.ABORTED, "PROVIDER_FAILED")
    assert error.message.startswith('section provider "loud" (global) failed: ')
    assert "boom xxx" in error.message
    assert len(error.message.encode()) <= MAX_MESSAGE_BYTES
    assert error.message.endswith("bytes, cut)")


async def test_a_render_error_listing_1500_variables_arrives_cut(client: dsp.Client) -> None:
    for index in range(1_500):
        await client.variable(f"variable_{index:04d}", "v")
    await client.section("typo", 1, "{{modle}}")
    error = await rejection(client.render(timeout=10))
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "RENDER_FAILED")
    assert error.message.startswith(
        'unknown prompt variable "{{modle}}" in section "typo"; registered variables: '
    )
    assert len(error.message.encode()) <= MAX_MESSAGE_BYTES


async def test_a_cut_message_never_splits_a_character(client: dsp.Client) -> None:
    def explode(ctx: dsp.AssembleContext) -> str:
        raise RuntimeError("漢" * 5_000)

    await client.section("wide", 1, explode)
    error = await rejection(client.assemble(timeout=10))
    assert error.reason == "PROVIDER_FAILED"
    assert "漢漢漢" in error.message and "\ufffd" not in error.message
    assert len(error.message.encode()) <= MAX_MESSAGE_BYTES


# -- bytes that are no request ------------------------------------------------------------

METHODS = [method.name for method in SERVICE.methods]
NOT_A_MESSAGE = b"\xff\xff\xff"  # a field number 0 tag: no protobuf message parses it


async def _refused_bytes(address: str, method: str, token: str | None) -> grpc.aio.AioRpcError:
    """How `method` refuses NOT_A_MESSAGE as its request, or as a stream's first message."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    described = SERVICE.methods_by_name[method]
    path, codec = f"/{SERVICE.full_name}/{method}", {"request_serializer": bytes}
    async with raw_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            if described.client_streaming:
                stream = channel.stream_stream(path, **codec)(timeout=5, metadata=metadata)
                await stream.write(NOT_A_MESSAGE)
                async for _ in stream:
                    pass
            elif described.server_streaming:
                async for _ in channel.unary_stream(path, **codec)(
                    NOT_A_MESSAGE, timeout=5, metadata=metadata
                ):
                    pass
            else:
                await channel.unary_unary(path, **codec)(
                    NOT_A_MESSAGE, timeout=5, metadata=metadata
                )
        return refused.value


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("token", [None, "admin-token-0123"], ids=["open", "with-a-credential"])
async def test_bytes_that_are_no_request_are_invalid_value_naming_the_message(
    make_sidecar: SidecarFactory, tmp_path: Path, method: str, token: str | None
) -> None:
    options: dict[str, object] = {}
    if token:
        (tmp_path / "admin.token").write_text(token)
        options["auth_token_file"] = str(tmp_path / "admin.token")
    sidecar = await make_sidecar(**options)
    refused = await _refused_bytes(sidecar.address, method, token)
    request = SERVICE.methods_by_name[method].input_type.name
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(refused.trailing_metadata() or ())["dsh-error-reason"] == "INVALID_VALUE"
    assert f"are not a{'n' if request[0] in 'AEIOU' else ''} {request} message" in (
        refused.details() or ""
    )


async def test_a_session_stream_message_that_is_no_message_ends_the_session(
    sidecar: Sidecar,
) -> None:
    async with raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        session = channel.stream_stream(
            f"/{SERVICE.full_name}/OpenSession",
            request_serializer=bytes,
            response_deserializer=pb.OpenSessionResponse.FromString,
        )(timeout=10)
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart()).SerializeToString())
        session_id = (await session.read()).opened.session_id
        section = pb.RegisterSectionRequest(session_id=session_id, name="mine", text="kept?")
        await stub.RegisterSection(section)
        await session.write(NOT_A_MESSAGE)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            while await session.read() is not grpc.aio.EOF:
                pass
        left = await stub.Assemble(pb.AssembleRequest())
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an OpenSessionRequest message" in (ended.value.details() or "")
    assert "mine" not in [section.name for section in left.assembly.sections]
