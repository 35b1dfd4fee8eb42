"""The MCP tools bridge (`dsh_system_prompt.mcp_tools`) over a real MCP server: the `mcp`
SDK's stdio client and a server on its own server API (tests/client/mcp_server.py), against a
real sidecar. Each change the server makes arrives as `notifications/tools/list_changed`
on the session the bridge was given, as in an agent.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt.mcp_tools import MAX_PAGES, McpTools, canonical_json
from helpers import next_events, tool_names
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

SERVER = Path(__file__).with_name("mcp_server.py")
OWN = ["mcp__fs__add_tool", "mcp__fs__echo", "mcp__fs__remove_tool", "mcp__fs__reverse_keys"]

Serve = Callable[..., AbstractAsyncContextManager[ClientSession]]


@pytest.fixture
def serve(tmp_path: Path) -> Serve:
    """An initialized session with a fresh test server started with `args`, its
    notifications handed to `bridge`; the server stops when the block ends."""

    @asynccontextmanager
    async def session(bridge: McpTools, *args: str) -> AsyncIterator[ClientSession]:
        params = StdioServerParameters(command=sys.executable, args=[str(SERVER), *args])
        with (tmp_path / "server.log").open("a") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, message_handler=bridge.message_handler) as mcp_session,
            ):
                await mcp_session.initialize()
                yield mcp_session

    return session


Attached = Callable[[], AbstractAsyncContextManager[tuple[McpTools, ClientSession]]]


@pytest.fixture
def attached(client: dsp.Client, serve: Serve) -> Attached:
    """The bridge "fs" attached to a fresh test server's session, for the block."""

    @asynccontextmanager
    async def bridged() -> AsyncIterator[tuple[McpTools, ClientSession]]:
        async with McpTools(client, "fs") as bridge, serve(bridge) as session:
            await bridge.attach(session)
            yield bridge, session

    return bridged


def parameters_json(assembly: dsp.PromptAssembly) -> dict[str, str]:
    return {tool.name: tool.parameters_json() or "" for tool in assembly.tools}


async def test_the_tools_are_one_labelled_registration_with_canonical_schemas(
    client: dsp.Client, attached: Attached
) -> None:
    async with attached() as (_bridge, session):
        assembly = await client.assemble()
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        snapshot = await client.snapshot()
    assert tool_names(assembly) == OWN
    echo = parameters_json(assembly)["mcp__fs__echo"]
    assert echo == canonical_json(listed["echo"].input_schema)
    assert echo.startswith('{"properties":{"count":{"default":1,"title":"Count","type":"integer"}')
    assert json.loads(echo) == listed["echo"].input_schema
    assert assembly.tools[1].description == "Echo the text back, count times."
    tools = [info for info in snapshot.registrations if info.kind == "tools"]
    assert [info.name for info in tools] == ["mcp:fs"]


async def test_keys_in_another_order_change_nothing(client: dsp.Client, attached: Attached) -> None:
    async with attached() as (bridge, session):
        before = parameters_json(await client.assemble())
        sent_before = [json.dumps(tool.input_schema) for tool in (await session.list_tools()).tools]
        changes = await client.watch_changes()
        await session.call_tool("reverse_keys", {})
        await bridge.settled()
        assert bridge.listings == 2  # the notification was followed: the server was asked
        sent_after = [json.dumps(tool.input_schema) for tool in (await session.list_tools()).tools]
        assert sent_after != sent_before  # the server did send other bytes
        assert parameters_json(await client.assemble()) == before
        # The next event is the marker's: the re-listing sent none.
        await client.section("marker", 1, "x")
        [event] = await next_events(changes, 1)
    assert (event.kind, event.name) == ("section", "marker")


async def test_a_tool_added_then_removed_is_one_update_each(
    client: dsp.Client, attached: Attached
) -> None:
    async with attached() as (bridge, session):
        changes = await client.watch_changes()
        await session.call_tool("add_tool", {"name": "abc"})
        [added] = await next_events(changes, 1)
        with_abc = await client.assemble()
        await session.call_tool("remove_tool", {"name": "abc"})
        [removed] = await next_events(changes, 1)
        without = await client.assemble()
        await bridge.settled()
        await client.section("marker", 1, "x")
        [marker] = await next_events(changes, 1)
    for event in (added, removed):
        assert (event.kind, event.action, event.name) == ("tools", "updated", "mcp:fs")
    assert tool_names(with_abc) == ["mcp__fs__abc", *OWN]
    assert parameters_json(with_abc)["mcp__fs__abc"] == canonical_json(
        json.loads(parameters_json(with_abc)["mcp__fs__abc"])
    )
    assert tool_names(without) == OWN
    assert marker.name == "marker"


async def test_a_restarted_server_is_listed_again(client: dsp.Client, serve: Serve) -> None:
    async with McpTools(client, "fs") as bridge:
        async with serve(bridge, "--extra", "grep") as session:
            await bridge.attach(session)
            first = parameters_json(await client.assemble())
        changes = await client.watch_changes()
        # The same tools, keys in another order: the reconnect changes nothing.
        async with serve(bridge, "--extra", "grep", "--reversed") as session:
            await bridge.attach(session)
            assert parameters_json(await client.assemble()) == first
        # Restarted with another tool set: one update.
        async with serve(bridge, "--extra", "glob") as session:
            await bridge.attach(session)
            [event] = await next_events(changes, 1)
            assembly = await client.assemble()
        assert bridge.listings == 3
    assert (event.kind, event.action, event.name) == ("tools", "updated", "mcp:fs")
    assert "mcp__fs__grep" in first
    assert tool_names(assembly) == ["mcp__fs__add_tool", "mcp__fs__echo", "mcp__fs__glob", *OWN[2:]]


async def test_instructions_holding_braces_render_as_written(
    client: dsp.Client, serve: Serve
) -> None:
    instructions = "Read {{x}} as written; {{ y }} and {{{z}}} too."
    async with McpTools(client, "my-fs") as bridge:
        async with serve(bridge, "--instructions", instructions) as session:
            await bridge.attach(session)
            rendered = await client.render()
            local = dsp.render_prompt(await client.assemble())
        async with serve(bridge, "--instructions", "Now {{other}}.") as session:
            await bridge.attach(session)
            again = await client.render()
    assert bridge.variable == "mcp_my_fs_instructions"
    assert rendered.prompt.endswith(f"\n\n{instructions}")
    assert local == rendered.prompt
    assert again.prompt.endswith("\n\nNow {{other}}.")


async def test_no_instructions_leave_no_text(client: dsp.Client, attached: Attached) -> None:
    async with attached():
        rendered = await client.render()
    assert [section.name for section in rendered.assembly.sections][-1] == "mcp:fs"
    assert rendered.prompt == "You are an AI agent powered by DeepSeek Harness."


async def test_dispose_removes_everything_it_registered(client: dsp.Client, serve: Serve) -> None:
    bridge = McpTools(client, "fs")
    async with serve(bridge, "--instructions", "be careful") as session:
        await bridge.attach(session)
        await bridge.dispose()
        await session.call_tool("add_tool", {"name": "late"})  # no longer followed
        await bridge.settled()
    snapshot = await client.snapshot()
    assembly = await client.assemble()
    assert not [info for info in snapshot.registrations if "mcp" in info.name]
    assert assembly.tools == []
    assert "mcp:fs" not in [section.name for section in assembly.sections]
    assert bridge.listings == 1


async def test_a_failed_first_attach_leaves_nothing_behind(
    client: dsp.Client, serve: Serve
) -> None:
    await client.variable("mcp_fs_instructions", "taken")
    async with McpTools(client, "fs") as bridge, serve(bridge) as session:
        with pytest.raises(dsp.SystemPromptError, match="already registered"):
            await bridge.attach(session)
    assembly = await client.assemble()
    assert assembly.tools == []


async def test_a_listing_in_pages_is_followed_to_its_end(client: dsp.Client, serve: Serve) -> None:
    async with McpTools(client, "fs") as bridge, serve(bridge, "--page-size", "1") as session:
        first_page = await session.list_tools()
        await bridge.attach(session)
        assembly = await client.assemble()
    assert len(first_page.tools) == 1 and first_page.next_cursor == "1"
    assert tool_names(assembly) == OWN


async def test_a_server_paging_forever_is_refused_after_max_pages(
    client: dsp.Client, serve: Serve
) -> None:
    async with McpTools(client, "fs") as bridge, serve(bridge, "--endless") as session:
        with pytest.raises(RuntimeError, match=f"still had a next page after {MAX_PAGES} pages"):
            await bridge.attach(session)
    assembly = await client.assemble()
    assert assembly.tools == []
    assert "mcp:fs" not in [section.name for section in assembly.sections]
