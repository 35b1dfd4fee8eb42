"""The MCP tools bridge: an MCP server's tools as one tools registration, kept current.

The agent owns its MCP connection and the `tools/call` path; the sidecar only needs the
schemas. Given the agent's `mcp.ClientSession` (the `mcp` package is never imported here:
it is the agent's, not a dependency of this client)::

    from dsh_system_prompt.mcp_tools import McpTools
    bridge = McpTools(client, "fs")              # or a Scope
    async with ClientSession(read, write, message_handler=bridge.message_handler) as session:
        init = await session.initialize()
        await bridge.attach(session, init.instructions)   # again after each reconnect
    ...
    await bridge.dispose()                       # the registration and the instructions

- The tools are one registration labelled `mcp:<server>`, named `mcp__<server>__<tool>`,
  sorted by name, each schema serialised canonically (sorted keys, no whitespace), so a
  reconnect, a protocol version or a server sending its keys in another order never changes
  the bytes, and never sends an update.
- `notifications/tools/list_changed` re-lists (in the background: the session's receive loop
  must not wait on its own request) and, when the bytes differ, updates the registration in
  place: watchers see one `updated` event. `attach()` after a reconnect re-lists the same way.
- The server's `instructions` are the value of the variable `mcp_<server>_instructions`
  (`-` and other characters a variable name cannot hold become `_`), and the section
  `mcp:<server>` is the text `{{mcp_<server>_instructions}}`: a variable's value is never
  scanned for `{{ }}` again (docs/rules.md, "Rendering"), so instructions holding `{{x}}`
  render as written. Without instructions the value is empty and the section is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import TYPE_CHECKING, Any, Protocol

from ._registrar import Handle
from .types import ToolSchema

if TYPE_CHECKING:
    from .client import Client, Scope

__all__ = ["McpTools", "canonical_json"]

LIST_CHANGED = "notifications/tools/list_changed"
# A server answering with a cursor forever would keep the bridge listing forever.
MAX_PAGES = 100
DEFAULT_INSTRUCTIONS_ORDER = 50.0

_log = logging.getLogger(__name__)


class McpSession(Protocol):
    """What the bridge uses of `mcp.ClientSession`: listing the tools, page by page."""

    async def list_tools(self, *, params: Any = None) -> Any: ...


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same bytes for the same value, whatever
    order the server sent its keys in."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def variable_name(server: str) -> str:
    """The instructions' variable: `mcp_<server>_instructions`, in a variable name's alphabet."""
    return f"mcp_{re.sub(r'[^a-z0-9_]', '_', server.lower())}_instructions"


class McpTools:
    """One MCP server's tools and instructions, registered through `registrar` (a client or
    a scope) and kept current; see the module's docstring."""

    def __init__(
        self,
        registrar: Client | Scope,
        server: str,
        *,
        instructions_order: float = DEFAULT_INSTRUCTIONS_ORDER,
    ) -> None:
        if not server:
            raise ValueError("an MCP server's name must be non-empty")
        self.server = server
        self.label = f"mcp:{server}"
        self.variable = variable_name(server)
        self._registrar = registrar
        self._order = instructions_order
        self._session: McpSession | None = None
        self._tools: Handle | None = None
        self._instructions: Handle | None = None
        self._section: Handle | None = None
        self._listed: list[ToolSchema] = []
        self._wire: str | None = None  # the registered list's canonical bytes
        self._instructions_text: str | None = None
        self._lock = asyncio.Lock()
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self.listings = 0  # listings done, counted so a test can see one happened
        self.last_error: BaseException | None = None  # of the last background re-listing

    @property
    def tools(self) -> list[ToolSchema]:
        """The tools as registered, in the registration's order."""
        return list(self._listed)

    def tool_name(self, tool: str) -> str:
        """The sidecar's name of the server's tool `tool`."""
        return f"mcp__{self.server}__{tool}"

    def server_tool(self, name: str) -> str | None:
        """The server's name of a sidecar tool name, or None when it is not this server's."""
        prefix = f"mcp__{self.server}__"
        return name[len(prefix) :] if name.startswith(prefix) else None

    async def message_handler(self, message: Any) -> None:
        """The session's `message_handler` (or call it from yours): a `tools/list_changed`
        notification re-lists in the background; anything else is left alone."""
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == LIST_CHANGED:
            self._schedule()

    async def attach(self, session: McpSession, instructions: str | None = None) -> None:
        """List `session`'s tools and register them (the first time) or update them (after
        a reconnect, only when the bytes differ); the same for `instructions`, by default
        the session's own (`session.instructions`, from its initialize result)."""
        if instructions is None:
            instructions = getattr(session, "instructions", None)
        self._session = session
        first = self._tools is None
        try:
            async with self._lock:
                await self._list(session)
                await self._set_instructions(instructions)
        except BaseException:
            if first:  # nothing half-registered is left behind
                await self.dispose()
            raise

    async def refresh(self) -> bool:
        """List the tools again now; True when the registration changed."""
        if self._session is None:
            raise RuntimeError("attach() an MCP session first")
        async with self._lock:
            return await self._list(self._session)

    async def settled(self) -> None:
        """Wait for the background re-listings asked for so far (by notifications)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def dispose(self) -> None:
        """Stop following the server and dispose the tools, the instructions' variable and
        its section (idempotent)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        handles = (self._section, self._instructions, self._tools)
        self._section = self._instructions = self._tools = None
        self._session = None
        for handle in handles:
            if handle is not None:
                await handle()

    async def __aenter__(self) -> McpTools:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.dispose()

    def _schedule(self) -> None:
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        # Notifications that arrive while a listing runs are answered by one more listing.
        while self._dirty and self._session is not None:
            self._dirty = False
            try:
                await self.refresh()
            except Exception as error:  # kept and logged: no caller awaits this task
                self.last_error = error
                _log.warning("re-listing MCP server %r's tools failed: %s", self.server, error)

    async def _list(self, session: McpSession) -> bool:
        listed = await _list_tools(session)
        self.listings += 1
        schemas = sorted(
            (
                ToolSchema.from_json(
                    self.tool_name(tool.name),
                    getattr(tool, "description", None) or "",
                    canonical_json(_field(tool, "input_schema", "inputSchema")),
                )
                for tool in listed
            ),
            key=lambda schema: schema.name,
        )
        wire = canonical_json(
            [[schema.name, schema.description, schema.parameters_json()] for schema in schemas]
        )
        if wire == self._wire:
            return False
        if self._tools is None:
            self._tools = await self._registrar.tools(schemas, name=self.label)
        else:
            await self._tools.update(schemas)
        self._listed, self._wire = schemas, wire
        return True

    async def _set_instructions(self, instructions: str | None) -> None:
        text = instructions or ""
        if self._instructions is None:
            self._instructions = await self._registrar.variable(self.variable, text)
            self._section = await self._registrar.section(
                self.label, self._order, f"{{{{{self.variable}}}}}"
            )
        elif text != self._instructions_text:
            await self._instructions.update(text)
        self._instructions_text = text


def _field(model: Any, name: str, v1_name: str) -> Any:
    """A field of the SDK's types: mcp 2 spells them in snake case, mcp 1 as on the wire."""
    return getattr(model, name) if hasattr(model, name) else getattr(model, v1_name)


async def _list_tools(session: McpSession) -> list[Any]:
    tools: list[Any] = []
    params: Any = None
    for _ in range(MAX_PAGES):
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = _field(page, "next_cursor", "nextCursor")
        if not cursor:
            return tools
        from mcp import types  # only past a first page: the agent's SDK, already loaded

        params = types.PaginatedRequestParams(cursor=cursor)
    raise RuntimeError(f"MCP tools/list still had a next page after {MAX_PAGES} pages")
