"""Failures: status codes, ErrorInfo reasons, idempotent disposers, closed clients."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from google.rpc import error_details_pb2, status_pb2
from helpers import ClientFactory, rejection, section_names, tool

ERROR_DOMAIN = "dsh.systemprompt.v1"
# One registration of each kind, made through a client.
REGISTRATIONS = [
    pytest.param(lambda c: c.section("s", 1, "x"), id="section"),
    pytest.param(lambda c: c.context("c", 1, "x"), id="context"),
    pytest.param(lambda c: c.variable("v", "x"), id="variable"),
    pytest.param(lambda c: c.tools([tool("t")]), id="tools"),
    pytest.param(lambda c: c.suppress_runtime_context(), id="suppressor"),
]


async def raw_failure(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The google.rpc.ErrorInfo detail of a failed call (the test fails without one)."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            assert status.code == error.code().value[0]
            assert status.message == error.details()
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return info
    raise AssertionError(f"no ErrorInfo detail on {error!r}")


# -- disposers ------------------------------------------------------------------------


async def test_disposing_twice_is_idempotent(client: dsp.Client) -> None:
    off = await client.section("rules", 10, "Be precise.")
    await off()
    await off()
    assert off.disposed
    assert "rules" not in section_names(await client.assemble())


async def test_disposing_twice_leaves_a_new_registration_of_the_name_alone(
    client: dsp.Client,
) -> None:
    off = await client.section("rules", 10, "old")
    await off()
    await client.section("rules", 10, "new")
    await off()
    assert (await client.assemble()).sections[-1] == dsp.AssembledSection("rules", "new")


@pytest.mark.parametrize("register", REGISTRATIONS)
async def test_every_kind_of_disposer_is_idempotent(
    client: dsp.Client, register: Callable[[dsp.Client], Awaitable[dsp.Disposer]]
) -> None:
    before = await client.assemble()
    off = await register(client)
    await off()
    await off()
    assert await client.assemble() == before


async def test_disposing_after_the_client_closed_is_harmless(connect: ClientFactory) -> None:
    client = await connect()
    off = await client.section("rules", 10, "Be precise.")
    await client.close()
    await off()
    assert off.disposed


async def test_a_disposer_of_one_session_disposes_only_its_own_registration(
    connect: ClientFactory,
) -> None:
    first, second = await connect(), await connect()
    off = await first.section("first", 10, "1")
    await second.section("second", 20, "2")
    await off()
    assert section_names(await second.assemble())[2:] == ["second"]


# -- closed clients -------------------------------------------------------------------


@pytest.mark.parametrize(
    "call", [*REGISTRATIONS, pytest.param(lambda c: c.scope("agent-1"), id="scope")]
)
async def test_registering_after_close_fails(
    connect: ClientFactory, call: Callable[[dsp.Client], Awaitable[object]]
) -> None:
    client = await connect()
    await client.close()
    error = await rejection(call(client))
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_registration_after_close_leaves_nothing_behind(connect: ClientFactory) -> None:
    closed, other = await connect(), await connect()
    await closed.close()
    await rejection(closed.section("late", 10, "late"))
    assert section_names(await other.assemble())[2:] == []


async def test_closing_twice_is_harmless(connect: ClientFactory) -> None:
    client, other = await connect(), await connect()
    await client.close()
    await client.close()
    assert (await rejection(client.assemble())).code == grpc.StatusCode.FAILED_PRECONDITION
    assert section_names(await other.assemble())[2:] == []


# -- unknown scopes -------------------------------------------------------------------


async def test_assembling_an_unknown_scope_gives_the_global_assembly(client: dsp.Client) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.variable("model", "deepseek-v4")
    await client.tools([tool("bash")])
    assert await client.assemble(scope="nobody-opened-this") == await client.assemble()


async def test_rendering_an_unknown_scope_renders_the_global_prompt(client: dsp.Client) -> None:
    await client.section("rules", 10, "Use {{model}}.")
    await client.variable("model", "deepseek-v4")
    rendered = await client.render(scope="nobody-opened-this")
    assert rendered.prompt == (
        "You are an AI agent powered by DeepSeek Harness.\n\nUse deepseek-v4."
    )


async def test_a_disposed_scope_assembles_like_an_unknown_one(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await agent.section("rules", 10, "Agent rules.")
    await agent.dispose()
    assert await client.assemble(scope="agent-1") == await client.assemble()


# -- client-side argument checks ------------------------------------------------------


async def test_a_text_that_is_neither_a_string_nor_a_provider_fails(client: dsp.Client) -> None:
    await rejection(client.section("rules", 10, 42))  # type: ignore[arg-type]
    assert "rules" not in section_names(await client.assemble())


async def test_an_order_that_is_not_a_number_fails(client: dsp.Client) -> None:
    await rejection(client.section("rules", "ten", "text"))  # type: ignore[arg-type]
    assert "rules" not in section_names(await client.assemble())


async def test_parameters_that_are_not_json_fail(client: dsp.Client) -> None:
    await rejection(client.tools([dsp.ToolSchema("bad", "set", {"enum": {1, 2}})]))
    await rejection(client.tools([dsp.ToolSchema("nan", "nan", {"maximum": math.nan})]))
    assert (await client.assemble()).tools == []


# -- the wire: status codes and ErrorInfo ---------------------------------------------


async def test_every_error_carries_error_info_in_the_contracts_domain(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    request = pb.RegisterSectionRequest(
        session_id=client.session_id, name="rules", order=10, text="Be precise."
    )
    await stub.RegisterSection(request)
    error = await raw_failure(stub.RegisterSection(request))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    info = error_info(error)
    assert (info.domain, info.reason) == (ERROR_DOMAIN, "DUPLICATE_NAME")


async def test_a_non_finite_order_on_the_wire_is_invalid_argument(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    request = pb.RegisterContextRequest(
        session_id=client.session_id, name="bad-order", order=math.nan, text="x"
    )
    error = await raw_failure(stub.RegisterContext(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == 'prompt context "bad-order" order must be a finite number'
    assert error_info(error).reason == "INVALID_ORDER"


async def test_a_call_on_an_unknown_session_is_failed_precondition(
    stub: pb_grpc.SystemPromptServiceStub,
) -> None:
    request = pb.RegisterSectionRequest(session_id="no-such-session", name="s", order=1, text="x")
    error = await raw_failure(stub.RegisterSection(request))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(error).domain == ERROR_DOMAIN


async def test_a_call_on_a_closed_session_is_failed_precondition(
    connect: ClientFactory, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    client = await connect()
    session_id = client.session_id
    await client.close()
    request = pb.RegisterVariableRequest(session_id=session_id, name="v", value="x")
    error = await raw_failure(stub.RegisterVariable(request))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_disposing_an_unknown_registration_is_not_found(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    request = pb.DisposeRequest(session_id=client.session_id, registration_id="no-such-id")
    error = await raw_failure(stub.Dispose(request))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(error).domain == ERROR_DOMAIN


async def test_disposing_twice_on_the_wire_is_not_found(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    registered = await stub.RegisterVariable(
        pb.RegisterVariableRequest(session_id=client.session_id, name="v", value="x")
    )
    dispose = pb.DisposeRequest(
        session_id=client.session_id, registration_id=registered.registration_id
    )
    await stub.Dispose(dispose)
    error = await raw_failure(stub.Dispose(dispose))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_disposing_another_sessions_registration_is_not_found_and_keeps_it(
    connect: ClientFactory, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    owner, other = await connect(), await connect()
    registered = await stub.RegisterSection(
        pb.RegisterSectionRequest(session_id=owner.session_id, name="owned", order=10, text="x")
    )
    request = pb.DisposeRequest(
        session_id=other.session_id, registration_id=registered.registration_id
    )
    error = await raw_failure(stub.Dispose(request))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "owned" in section_names(await owner.assemble())


@pytest.mark.parametrize(
    "parameters_json", ["{not json", "[1, 2]", '"text"', "", '{"a": NaN}'], ids=repr
)
async def test_tool_parameters_that_are_not_a_json_object_are_invalid_argument(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub, parameters_json: str
) -> None:
    schema = pb.ToolSchema(name="bad", description="bad", parameters_json=parameters_json)
    request = pb.RegisterToolsRequest(
        session_id=client.session_id, result=pb.ToolProviderResult(schemas=[schema])
    )
    error = await raw_failure(stub.RegisterTools(request))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(error).domain == ERROR_DOMAIN
    assert (await client.assemble()).tools == []


async def test_tool_parameters_arrive_byte_for_byte(
    client: dsp.Client, stub: pb_grpc.SystemPromptServiceStub
) -> None:
    parameters_json = '{"type": "object",  "properties": {"z": {"maximum": 10}, "a": {}}}'
    schema = pb.ToolSchema(name="exact", description="d", parameters_json=parameters_json)
    await stub.RegisterTools(
        pb.RegisterToolsRequest(
            session_id=client.session_id, result=pb.ToolProviderResult(schemas=[schema])
        )
    )
    reply = await stub.Assemble(pb.AssembleRequest())
    assert [t.parameters_json for t in reply.assembly.tools] == [parameters_json]


async def test_an_empty_scope_key_is_invalid_argument(client: dsp.Client) -> None:
    error = await rejection(client.scope(""))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_empty_section_name_is_invalid_argument(client: dsp.Client) -> None:
    error = await rejection(client.section("", 10, "text"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_an_empty_context_name_is_invalid_argument(client: dsp.Client) -> None:
    error = await rejection(client.context("", 10, "text"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_rejected_assembly_does_not_disturb_the_next_one(client: dsp.Client) -> None:
    await client.section("first", 1, "One.", complete=True)
    agent = await client.scope("agent-1")
    await agent.section("second", 2, "Two.", complete=True)
    await rejection(client.assemble(scope="agent-1"))
    assert (await client.assemble()).sections == [dsp.AssembledSection("first", "One.")]


async def test_a_render_error_is_a_system_prompt_error_with_its_reason(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "{{nope}}")
    error = await rejection(client.render())
    assert isinstance(error, dsp.RenderError)
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "RENDER_FAILED")


async def test_a_rejected_registration_publishes_no_change(client: dsp.Client) -> None:
    await client.section("rules", 10, "first")
    changes = await client.watch_changes()
    try:
        await rejection(client.section("rules", 10, "duplicate"))
        await rejection(client.variable("Not Valid", "x"))
        await rejection(client.context("bad-order", math.inf, "x"))
        await client.variable("marker", "x")
        event = await asyncio.wait_for(anext(changes), 5)
    finally:
        await changes.close()
    assert (event.kind, event.action, event.name) == ("variable", "registered", "marker")
    assert event.revision == changes.revision + 1


async def test_the_reason_also_travels_as_a_plain_trailer(sidecar: Sidecar) -> None:
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        call = stub.Dispose(pb.DisposeRequest(session_id="nobody", registration_id="x"))
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        trailers = dict(await call.trailing_metadata())
    assert trailers["dsh-error-reason"] == "UNKNOWN_SESSION"


async def test_streams_that_start_wrong_are_refused_cleanly(sidecar: Sidecar) -> None:
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session = stub.OpenSession()
        await session.write(pb.OpenSessionRequest(provided=pb.ProvideResponse(call_id=1)))
        listener = stub.Listen()
        await listener.write(pb.ListenRequest(result=pb.ListenerResult(invocation_id=1)))
        stranger = stub.Listen()
        await stranger.write(pb.ListenRequest(start=pb.ListenStart(session_id="nobody")))
        codes = [await call.code() for call in (session, listener, stranger)]
        reply = await stub.Assemble(pb.AssembleRequest())  # and the sidecar serves on
    assert codes == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
    ]
    assert reply.assembly.sections


async def test_a_listener_reply_with_a_bad_tool_slot_fails_that_assembly(sidecar: Sidecar) -> None:
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session = stub.OpenSession()
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart()))
        session_id = (await session.read()).opened.session_id
        listener = stub.Listen()
        await listener.write(pb.ListenRequest(start=pb.ListenStart(session_id=session_id)))
        await listener.read()  # registered
        assembling = asyncio.ensure_future(stub.Assemble(pb.AssembleRequest(), timeout=5))
        invocation = (await listener.read()).invocation
        reply = pb.ListenerResult(invocation_id=invocation.invocation_id, tool_slots=[99])
        await listener.write(pb.ListenRequest(result=reply))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await assembling
        session.cancel()
        listener.cancel()
    assert failure.value.code() == grpc.StatusCode.ABORTED
    assert "tool slot 99 is out of range" in str(failure.value.details())
