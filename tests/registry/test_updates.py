"""Atomic updates: a static registration's value replaced in place, never missing."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp
import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import (
    ClientFactory,
    SidecarFactory,
    eventually,
    failure,
    next_events,
    raw_channel,
    raw_stub,
    refusal,
    rejection,
    section,
    tool,
    tool_names,
)
from processes import free_port, serve


async def test_renders_racing_300_updates_of_a_variable_never_fail(
    connect: ClientFactory,
) -> None:
    # The race: dispose-then-register failed 299 of 587 such renders.
    writer, reader_one, reader_two = await connect(), await connect(), await connect()
    await writer.section("model", 10, "Model: {{model}}")
    model = await writer.variable("model", "v0")
    seen: set[str] = set()
    failures: list[dsp.SystemPromptError] = []
    done = asyncio.Event()

    async def render_until_done(reader: dsp.Client) -> int:
        count = 0
        while not done.is_set():
            try:
                seen.add((await reader.render()).prompt.rsplit("Model: ", 1)[1])
            except dsp.SystemPromptError as error:
                failures.append(error)
            count += 1
        return count

    readers = [asyncio.create_task(render_until_done(r)) for r in (reader_one, reader_two)]
    for index in range(1, 301):
        await model.update(f"v{index}")
        await asyncio.sleep(0)  # let the readers in between updates
    done.set()
    renders = sum(await asyncio.gather(*readers))
    assert failures == []
    assert renders > 100, renders
    assert seen <= {f"v{index}" for index in range(301)}
    assert (await reader_one.render()).prompt.endswith("Model: v300")


async def test_an_update_is_one_updated_event_with_a_new_revision(connect: ClientFactory) -> None:
    owner, watcher = await connect(), await connect()
    scope = await owner.scope("agent-1")
    rules = await scope.section("rules", 10, "old")
    changes = await watcher.watch_changes()
    revision = await rules.update("new")
    [event] = await next_events(changes, 1)
    assert (event.revision, event.kind, event.action, event.name, event.scope) == (
        revision,
        "section",
        "updated",
        "rules",
        "agent-1",
    )
    assembly = await watcher.assemble(scope="agent-1")
    assert section("rules", "new") in assembly.sections


async def test_an_update_keeps_the_name_order_and_place_of_the_section(
    client: dsp.Client,
) -> None:
    await client.section("first", 1, "a")
    middle = await client.section("middle", 5, "b")
    await client.section("last", 9, "c")
    await middle.update("B")
    texts = [(s.name, s.text) for s in (await client.assemble()).sections[-3:]]
    assert texts == [("first", "a"), ("middle", "B"), ("last", "c")]


async def test_updating_to_the_value_held_changes_nothing(client: dsp.Client) -> None:
    rules = await client.section("rules", 10, "same")
    changes = await client.watch_changes()
    revision = await rules.update("same")
    assert revision == changes.revision
    await client.section("marker", 11, "m")
    [event] = await next_events(changes, 1)
    assert (event.name, event.action) == ("marker", "registered")


async def test_a_variable_updates_to_no_value_and_back(client: dsp.Client) -> None:
    who = await client.variable("who", "alice")
    await who.update(None)
    assert (await client.assemble()).variables["who"] is None
    await who.update("bob")
    assert (await client.assemble()).variables["who"] == "bob"


async def test_a_context_updates_its_text(client: dsp.Client) -> None:
    cwd = await client.context("cwd", 1, "cwd: /a")
    await cwd.update("cwd: /b")
    assert [c.text for c in (await client.assemble()).contexts] == ["cwd: /b"]


async def test_a_tool_provider_updates_its_tools(client: dsp.Client) -> None:
    tools = await client.tools([tool("bash")])
    await tools.update(dsp.ToolProviderResult(schemas=[tool("read"), tool("write")]))
    assert tool_names(await client.assemble()) == ["read", "write"]


async def test_a_refused_update_keeps_the_old_value(make_sidecar: SidecarFactory) -> None:
    sidecar: Sidecar = await make_sidecar(limits={"max_text_bytes": 16})
    async with dsp.connect(sidecar.address) as client:
        rules = await client.section("rules", 10, "short")
        revision = sidecar.registry.revision
        too_large = await rejection(rules.update("x" * 17))
        malformed = await rejection(rules.update("{{ model }}"))
        assert (too_large.code, too_large.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            dsp.Reason.VALUE_TOO_LARGE,
        )
        assert (malformed.code, malformed.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            dsp.Reason.RENDER_FAILED,
        )
        assert sidecar.registry.revision == revision
        assert section("rules", "short") in (await client.assemble()).sections


async def test_an_update_to_the_reserved_tool_name_is_refused(client: dsp.Client) -> None:
    tools = await client.tools([tool("bash")])
    error = await rejection(tools.update([tool(dsp.TOOL_ORDER_REST)]))
    assert error.reason == dsp.Reason.RESERVED_TOOL_NAME
    assert tool_names(await client.assemble()) == ["bash"]


async def test_a_dynamic_registration_is_not_updatable(client: dsp.Client) -> None:
    cwd = await client.section("cwd", 10, lambda ctx: "/tmp")
    error = await rejection(cwd.update("/home"))
    assert failure(error) == refusal(
        "NOT_UPDATABLE",
        'section "cwd" cannot be updated: its value comes from a dynamic provider,'
        " which already gives the latest one",
    )


async def test_update_takes_only_a_static_value(client: dsp.Client) -> None:
    rules = await client.section("rules", 10, "text")
    error = await rejection(rules.update(lambda ctx: "provided"))
    assert (error.code, error.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        dsp.Reason.INVALID_VALUE,
    )


async def test_an_update_after_dispose_is_not_found_and_off_still_works(
    client: dsp.Client,
) -> None:
    rules = await client.section("rules", 10, "text")
    await rules.update("newer")
    await rules()
    await rules()  # idempotent, as every disposer
    assert rules.disposed
    error = await rejection(rules.update("again"))
    assert (error.code, error.reason) == (
        grpc.StatusCode.NOT_FOUND,
        dsp.Reason.REGISTRATION_NOT_FOUND,
    )


async def test_an_update_of_the_wrong_kind_of_value_is_refused(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, "text")
    [entry] = sidecar.registry.registrations(client.session_id)
    request = pb.UpdateRequest(
        session_id=client.session_id, registration_id=entry.id, tools=pb.ToolProviderResult()
    )
    error = await raw_rejection(sidecar, request)
    assert (error.code(), error.details()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        'an update of section "rules" needs a text',
    )
    assert error.trailing_metadata()["dsh-error-reason"] == "WRONG_VALUE_KIND"


async def test_another_sessions_registration_cannot_be_updated(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    owner, other = await connect(), await connect()
    await owner.section("rules", 10, "mine")
    [entry] = sidecar.registry.registrations(owner.session_id)
    request = pb.UpdateRequest(session_id=other.session_id, registration_id=entry.id, text="x")
    error = await raw_rejection(sidecar, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert section("rules", "mine") in (await other.assemble()).sections


async def raw_rejection(sidecar: Sidecar, request: pb.UpdateRequest) -> grpc.aio.AioRpcError:
    async with raw_channel(sidecar.address) as channel:
        try:
            await raw_stub(channel).Update(request)
        except grpc.aio.AioRpcError as error:
            return error
    raise AssertionError("the update was accepted")


async def test_a_replay_after_a_restart_registers_the_latest_value() -> None:
    address = f"127.0.0.1:{free_port()}"
    async with serve("--listen", address) as first, dsp.connect(address) as client:
        model = await client.variable("model", "before")
        await model.update("after")
        first.process.kill()
        await first.process.wait()
        await eventually(lambda: not client.connected, "the client sees it down", timeout=10)
        async with serve("--listen", address):
            await eventually(lambda: client.connected, "the client reconnects", timeout=20)
            assert (await client.assemble(timeout=5)).variables["model"] == "after"
            await model.update("later")  # the handle works on the new session
            assert (await client.assemble(timeout=5)).variables["model"] == "later"
