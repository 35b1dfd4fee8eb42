"""Static tool lists, name order, the configured tool order and tool schemas on the wire."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from helpers import ClientFactory, SidecarFactory, failure, refusal, rejection, tool, tool_names

REST = dsp.TOOL_ORDER_REST


Ordered = Callable[[list[str]], Awaitable[dsp.Client]]


@pytest.fixture
async def ordered(make_sidecar: SidecarFactory) -> AsyncIterator[Ordered]:
    """Open a client of a new sidecar with the `tool_order` given; all closed at the end."""
    clients: list[dsp.Client] = []

    async def open_client(tool_order: list[str]) -> dsp.Client:
        sidecar = await make_sidecar(tool_order=tool_order)
        clients.append(await dsp.connect(sidecar.address))
        return clients[-1]

    yield open_client
    for client in clients:
        await client.close()


# -- static lists ---------------------------------------------------------------------


async def test_a_static_tool_list_is_in_the_assembly(client: dsp.Client) -> None:
    echo = dsp.ToolSchema("echo", "Echo the input back.", {"type": "object", "properties": {}})
    await client.tools([echo])
    assert (await client.assemble()).tools == [echo]


async def test_a_static_tool_provider_result_is_in_the_assembly(client: dsp.Client) -> None:
    await client.tools(dsp.ToolProviderResult(schemas=[tool("echo")]))
    assert (await client.assemble()).tools == [tool("echo")]


async def test_an_empty_tool_list_contributes_nothing(client: dsp.Client) -> None:
    await client.tools([])
    assert (await client.assemble()).tools == []


async def test_tools_of_every_provider_are_collected(connect: ClientFactory) -> None:
    first, second = await connect(), await connect()
    await first.tools([tool("bash")])
    await second.tools([tool("read"), tool("grep")])
    await first.tools([tool("edit")])
    assert tool_names(await first.assemble()) == ["bash", "edit", "grep", "read"]


async def test_disposing_a_tool_provider_removes_its_tools(client: dsp.Client) -> None:
    await client.tools([tool("bash")])
    off = await client.tools([tool("read")])
    await off()
    assert tool_names(await client.assemble()) == ["bash"]


# -- order without tool_order ---------------------------------------------------------


async def test_tools_are_sorted_by_name_without_a_tool_order(client: dsp.Client) -> None:
    await client.tools([tool("todo_write"), tool("bash")])
    await client.tools([tool("read"), tool("edit")])
    assert tool_names(await client.assemble()) == ["bash", "edit", "read", "todo_write"]


async def test_tool_names_sort_in_code_point_order(client: dsp.Client) -> None:
    await client.tools([tool(name) for name in ("b", "a", "_x", "Z", "B", "a1", "A")])
    assert tool_names(await client.assemble()) == ["A", "B", "Z", "_x", "a", "a1", "b"]


async def test_tool_names_beyond_the_basic_plane_sort_by_code_point_not_utf16(
    client: dsp.Client,
) -> None:
    emoji, fullwidth = "\U0001f600tool", "\uff5etool"  # UTF-16 would put the emoji first
    await client.tools([tool(emoji), tool(fullwidth)])
    assert tool_names(await client.assemble()) == [fullwidth, emoji]


async def test_tools_with_the_same_name_keep_registration_order(client: dsp.Client) -> None:
    await client.tools([tool("echo", "first")])
    await client.tools([tool("bash"), tool("echo", "second")])
    assembly = await client.assemble()
    assert [(t.name, t.description) for t in assembly.tools] == [
        ("bash", "the bash tool"),
        ("echo", "first"),
        ("echo", "second"),
    ]


# -- tool_order -----------------------------------------------------------------------


async def test_listed_tools_take_their_listed_place(ordered: Ordered) -> None:
    client = await ordered(["todo_write", "bash", REST])
    await client.tools([tool("bash"), tool("todo_write")])
    assert tool_names(await client.assemble()) == ["todo_write", "bash"]


async def test_unlisted_tools_go_to_the_rest_entry_sorted_by_name(ordered: Ordered) -> None:
    client = await ordered(["todo_write", REST, "bash"])
    await client.tools([tool("read"), tool("bash"), tool("todo_write")])
    await client.tools([tool("grep"), tool("edit")])
    names = tool_names(await client.assemble())
    assert names == ["todo_write", "edit", "grep", "read", "bash"]


async def test_a_rest_entry_alone_sorts_every_tool_by_name(ordered: Ordered) -> None:
    client = await ordered([REST])
    await client.tools([tool("read"), tool("bash")])
    assert tool_names(await client.assemble()) == ["bash", "read"]


async def test_a_rest_entry_alone_with_no_tools_is_not_an_error(ordered: Ordered) -> None:
    client = await ordered([REST])
    assert (await client.assemble()).tools == []


async def test_tool_order_listing_unregistered_tools_rejects_the_assembly(ordered: Ordered) -> None:
    client = await ordered(["ghost", "bash", REST, "wraith"])
    await client.tools([tool("todo_write"), tool("bash")])
    error = await rejection(client.assemble())
    assert failure(error) == refusal(
        "UNKNOWN_TOOL_ORDER_NAME",
        'toolOrder lists unregistered tools "ghost", "wraith"; known tools: bash, todo_write',
    )


async def test_one_unregistered_tool_is_named_in_the_singular(ordered: Ordered) -> None:
    client = await ordered(["ghost", REST])
    await client.tools([tool("bash")])
    error = await rejection(client.assemble())
    assert failure(error) == refusal(
        "UNKNOWN_TOOL_ORDER_NAME", 'toolOrder lists unregistered tool "ghost"; known tools: bash'
    )


async def test_with_nothing_known_the_known_tools_are_none(ordered: Ordered) -> None:
    client = await ordered(["ghost", REST])
    error = await rejection(client.assemble())
    assert failure(error) == refusal(
        "UNKNOWN_TOOL_ORDER_NAME", 'toolOrder lists unregistered tool "ghost"; known tools: (none)'
    )


async def test_known_tools_are_listed_once_each(ordered: Ordered) -> None:
    client = await ordered(["ghost", REST])
    await client.tools([tool("bash")])
    await client.tools(dsp.ToolProviderResult(schemas=[], known_names=["bash", "read"]))
    error = await rejection(client.assemble())
    assert error.message == 'toolOrder lists unregistered tool "ghost"; known tools: bash, read'


async def test_registering_the_missing_tool_lets_the_assembly_through(ordered: Ordered) -> None:
    client = await ordered(["ghost", REST])
    await rejection(client.assemble())
    await client.tools([tool("ghost")])
    assert tool_names(await client.assemble()) == ["ghost"]


async def test_known_names_count_for_the_tool_order(ordered: Ordered) -> None:
    client = await ordered(["todo_write", "bash", REST])
    await client.tools(
        dsp.ToolProviderResult(schemas=[tool("bash")], known_names=["bash", "todo_write"])
    )
    assert tool_names(await client.assemble()) == ["bash"]


async def test_known_names_of_every_provider_count(ordered: Ordered) -> None:
    client = await ordered(["todo_write", "bash", REST])
    await client.tools(dsp.ToolProviderResult(schemas=[], known_names=["todo_write"]))
    await client.tools(dsp.ToolProviderResult(schemas=[tool("bash")], known_names=["bash"]))
    assert tool_names(await client.assemble()) == ["bash"]


async def test_known_names_default_to_the_schemas_names(ordered: Ordered) -> None:
    client = await ordered(["todo_write", REST])
    await client.tools(dsp.ToolProviderResult(schemas=[tool("todo_write")]))
    assert tool_names(await client.assemble()) == ["todo_write"]


async def test_a_disposed_providers_known_names_no_longer_count(ordered: Ordered) -> None:
    client = await ordered(["todo_write", REST])
    off = await client.tools(dsp.ToolProviderResult(schemas=[], known_names=["todo_write"]))
    await client.assemble()
    await off()
    error = await rejection(client.assemble())
    assert error.reason == "UNKNOWN_TOOL_ORDER_NAME"


async def test_a_scoped_providers_known_names_count_only_in_that_scope(ordered: Ordered) -> None:
    client = await ordered(["agent_tool", REST])
    scope = await client.scope("agent-1")
    await scope.tools([tool("agent_tool")])
    assert tool_names(await client.assemble(scope="agent-1")) == ["agent_tool"]
    error = await rejection(client.assemble())
    assert failure(error) == refusal(
        "UNKNOWN_TOOL_ORDER_NAME",
        'toolOrder lists unregistered tool "agent_tool"; known tools: (none)',
    )


# -- the reserved rest-entry name -----------------------------------------------------


async def test_a_tool_named_like_the_rest_entry_rejects_the_assembly(client: dsp.Client) -> None:
    await client.tools(lambda ctx: [tool("bash"), tool(REST)])
    error = await rejection(client.assemble())
    assert failure(error) == refusal(
        "RESERVED_TOOL_NAME",
        'tool provider returned reserved tool name "<unlisted-tools>"'
        " (reserved for toolOrder's rest entry)",
    )


async def test_the_reserved_name_rejects_with_a_tool_order_too(ordered: Ordered) -> None:
    client = await ordered([REST])
    await client.tools(lambda ctx: [tool(REST)])
    error = await rejection(client.assemble())
    assert (error.code, error.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "RESERVED_TOOL_NAME")


async def test_disposing_the_reserved_name_provider_restores_the_assembly(
    client: dsp.Client,
) -> None:
    await client.tools([tool("bash")])
    off = await client.tools(lambda ctx: [tool(REST)])
    await rejection(client.assemble())
    await off()
    assert tool_names(await client.assemble()) == ["bash"]


async def test_the_rest_entry_constant_is_the_reserved_name() -> None:
    assert dsp.TOOL_ORDER_REST == "<unlisted-tools>"


# -- parameters as JSON ---------------------------------------------------------------


async def through_the_sidecar(client: dsp.Client, parameters: dict[str, Any]) -> dict[str, Any]:
    """`parameters` as they come back in an assembly, registered as a tool's."""
    await client.tools([dsp.ToolSchema("tool", "the tool", parameters)])
    (returned,) = (await client.assemble()).tools
    return returned.parameters


async def test_parameters_keep_their_key_order(client: dsp.Client) -> None:
    parameters = {
        "type": "object",
        "required": ["zulu", "alpha"],
        "properties": {
            "zulu": {"type": "string", "description": "last letter first"},
            "alpha": {"type": "integer", "minimum": 0},
            "mike": {"type": "object", "properties": {"y": {}, "b": {}, "x": {}}},
        },
        "additionalProperties": False,
    }
    returned = await through_the_sidecar(client, parameters)
    assert json.dumps(returned) == json.dumps(parameters)


async def test_integer_parameters_stay_integers(client: dsp.Client) -> None:
    parameters = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9007199254740993}},
        "maxProperties": 3,
    }
    returned = await through_the_sidecar(client, parameters)
    n = returned["properties"]["n"]
    assert type(n["minimum"]) is int
    assert n["maximum"] == 9007199254740993
    assert type(returned["maxProperties"]) is int


async def test_float_parameters_stay_floats(client: dsp.Client) -> None:
    parameters = {"type": "number", "multipleOf": 0.5, "minimum": 1.0}
    returned = await through_the_sidecar(client, parameters)
    assert json.dumps(returned) == json.dumps(parameters)


async def test_parameters_keep_unicode_nulls_and_nesting(client: dsp.Client) -> None:
    parameters = {
        "type": "object",
        "description": 'héllo ✓ 𝄞 "quoted" \\ back',
        "default": None,
        "enum": [[1, [2, {"deep": True}]], "x"],
    }
    returned = await through_the_sidecar(client, parameters)
    assert returned == parameters
    assert json.dumps(returned) == json.dumps(parameters)


async def test_empty_parameters_come_back_empty(client: dsp.Client) -> None:
    await client.tools([dsp.ToolSchema("bare", "no parameters", {})])
    assert (await client.assemble()).tools == [dsp.ToolSchema("bare", "no parameters", {})]


# -- scoped providers -----------------------------------------------------------------


async def test_a_scoped_provider_is_consulted_only_for_that_scopes_assemblies(
    client: dsp.Client,
) -> None:
    await client.tools([tool("bash")])
    agent = await client.scope("agent-1")
    await client.scope("agent-2")
    await agent.tools([tool("agent_tool")])
    assert tool_names(await client.assemble(scope="agent-1")) == ["agent_tool", "bash"]
    assert tool_names(await client.assemble()) == ["bash"]
    assert tool_names(await client.assemble(scope="agent-2")) == ["bash"]


async def test_scoped_and_global_tools_are_sorted_together(client: dsp.Client) -> None:
    await client.tools([tool("read"), tool("bash")])
    agent = await client.scope("agent-1")
    await agent.tools([tool("grep"), tool("aardvark")])
    names = tool_names(await client.assemble(scope="agent-1"))
    assert names == ["aardvark", "bash", "grep", "read"]


async def test_scoped_tools_follow_the_tool_order(ordered: Ordered) -> None:
    client = await ordered(["todo_write", REST, "bash"])
    await client.tools([tool("bash"), tool("read")])
    agent = await client.scope("agent-1")
    await agent.tools([tool("todo_write"), tool("edit")])
    names = tool_names(await client.assemble(scope="agent-1"))
    assert names == ["todo_write", "edit", "read", "bash"]


async def test_global_providers_come_before_scoped_ones_for_equal_names(
    client: dsp.Client,
) -> None:
    agent = await client.scope("agent-1")
    await agent.tools([tool("echo", "scoped, registered first")])
    await client.tools([tool("echo", "global, registered later")])
    assembly = await client.assemble(scope="agent-1")
    assert [t.description for t in assembly.tools] == [
        "global, registered later",
        "scoped, registered first",
    ]


# -- invariants -----------------------------------------------------------------------


async def test_a_static_tool_list_with_the_reserved_name_is_refused_at_registration(
    client: dsp.Client,
) -> None:
    error = await rejection(client.tools([tool("bash"), tool(REST)]))
    assert failure(error) == refusal(
        "RESERVED_TOOL_NAME",
        'tool provider returned reserved tool name "<unlisted-tools>"'
        " (reserved for toolOrder's rest entry)",
    )
    assert tool_names(await client.assemble()) == []  # nothing left behind, nothing poisoned


async def test_a_static_tool_with_an_empty_name_is_refused_at_registration(
    client: dsp.Client,
) -> None:
    error = await rejection(client.tools([dsp.ToolSchema("", "nameless", {})]))
    assert failure(error) == refusal("INVALID_NAME", "tool names must be non-empty")
    assert tool_names(await client.assemble()) == []


async def test_a_tool_with_an_empty_name_rejects_the_assembly(client: dsp.Client) -> None:
    await client.tools(lambda ctx: [dsp.ToolSchema("", "nameless", {})])
    error = await rejection(client.assemble())
    assert failure(error) == refusal(
        "INVARIANT_VIOLATION", "assembled tool names must be non-empty"
    )
