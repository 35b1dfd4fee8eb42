"""A small MCP server over stdio for the MCP tools bridge's tests, on the `mcp` SDK's own
server API (MCPServer, FastMCP's name in mcp 2).

`python mcp_server.py [--instructions TEXT] [--reversed] [--extra NAME]... [--page-size N]
[--endless]` serves `echo`,
the extra tools named, and tools that change the server's own list, each sending
`notifications/tools/list_changed`: `add_tool`, `remove_tool`, and `reverse_keys`, which sends
every schema with its keys in the opposite order (what one server did across two protocol
versions) without changing what they say. `--page-size` lists the tools N a page, with
cursors; `--endless` answers every page with a next cursor, forever (a hostile server).
"""

from __future__ import annotations

import argparse
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ListToolsResult, PaginatedRequestParams


def _reversed(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reversed(value[key]) for key in reversed(value)}
    if isinstance(value, list):
        return [_reversed(item) for item in value]
    return value


def _extra_tool(name: str) -> None:
    def extra(path: str, depth: int = 1) -> str:
        return f"{name} {path} {depth}"

    server.add_tool(extra, name=name, description=f"the {name} tool")


parser = argparse.ArgumentParser()
parser.add_argument("--instructions")
parser.add_argument("--reversed", action="store_true")
parser.add_argument("--extra", action="append", default=[])
parser.add_argument("--page-size", type=int, default=0)
parser.add_argument("--endless", action="store_true")
options = parser.parse_args()


class PagedServer(MCPServer[Any]):
    """MCPServer whose tools/list answers in pages (the SDK's own handler lists all at once)."""

    async def _handle_list_tools(
        self, ctx: Any, params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        tools = await self.list_tools()
        start = int(params.cursor) if params is not None and params.cursor else 0
        if options.endless:
            return ListToolsResult(tools=tools[:1], next_cursor=str(start + 1))
        if not options.page_size:
            return ListToolsResult(tools=tools)
        end = start + options.page_size
        return ListToolsResult(
            tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
        )


server = PagedServer("test-server", instructions=options.instructions)


@server.tool(description="Echo the text back, count times.")
def echo(text: str, count: int = 1, upper: bool = False) -> str:
    return text * count


@server.tool(description="Add a tool named `name` and say the list changed.")
async def add_tool(name: str, ctx: Context) -> str:
    _extra_tool(name)
    await ctx.session.send_tool_list_changed()
    return "added"


@server.tool(description="Remove the tool named `name` and say the list changed.")
async def remove_tool(name: str, ctx: Context) -> str:
    server.remove_tool(name)
    await ctx.session.send_tool_list_changed()
    return "removed"


def _reverse_all() -> None:
    for tool in server._tool_manager.list_tools():  # the test server reaches into its own SDK
        tool.parameters = _reversed(tool.parameters)


@server.tool(description="Send every schema's keys in the opposite order; say the list changed.")
async def reverse_keys(ctx: Context) -> str:
    _reverse_all()
    await ctx.session.send_tool_list_changed()
    return "reversed"


for extra_name in options.extra:
    _extra_tool(extra_name)
if options.reversed:
    _reverse_all()

if __name__ == "__main__":
    server.run("stdio")
