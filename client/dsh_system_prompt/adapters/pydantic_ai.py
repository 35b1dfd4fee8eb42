"""pydantic-ai: instructions, tools and the snapshot of one assembly per model request.

    prompt = PydanticAIPrompt(client, scope="agent-1", report_key="conv-7")
    agent = Agent(model, instructions=prompt.instructions, tools=prompt.tools(handlers),
                  capabilities=prompt.capabilities())

Each model request of a run (its run id and step) is assembled once, shared by three hooks:
`instructions` is its rendered prompt; `prepare_tools` (the `PrepareTools` capability) keeps
the tools it has, in its order (an agent's tools are otherwise in registration order), with
its descriptions and schemas, not strict; `snapshot` (the `ProcessHistory` capability) puts
its runtime-context snapshot after the history, in the last request.
Importing this module imports `pydantic_ai`; the client never does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from pydantic_ai import RunContext, Tool
from pydantic_ai.capabilities import AbstractCapability, PrepareTools, ProcessHistory
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.tools import ToolDefinition

from ..types import RenderedPrompt
from ._providers import parameters
from ._turns import Turns

Handler = Callable[..., Awaitable[Any]]
"""A tool's implementation, called with the model's arguments as keywords."""


class PydanticAIPrompt(Turns):
    """The registry's prompt and tools for a `pydantic_ai.Agent`, one assembly per request."""

    def turn(self, ctx: RunContext[Any]) -> Awaitable[RenderedPrompt]:
        """The assembly of this model request, made by whichever hook asks first."""
        return self._assembled((ctx.run_id, ctx.run_step))

    async def instructions(self, ctx: RunContext[Any]) -> str:
        """`Agent(instructions=...)`: the request's rendered prompt."""
        return (await self.turn(ctx)).prompt

    async def prepare_tools(
        self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        """`Agent(prepare_tools=...)`: the agent's tools that are assembled, as assembled."""
        by_name = {tool.name: tool for tool in tool_defs}
        return [
            dataclasses.replace(
                by_name[tool.name],
                description=tool.description,
                parameters_json_schema=parameters(tool),
                strict=False,
            )
            for tool in (await self.turn(ctx)).assembly.tools
            if tool.name in by_name
        ]

    async def snapshot(
        self, ctx: RunContext[Any], messages: list[ModelMessage]
    ) -> list[ModelMessage]:
        """`Agent(history_processors=[...])`: the request's snapshot, last in the last request."""
        text = (await self.turn(ctx)).context_snapshot
        if not text or not messages or not isinstance(messages[-1], ModelRequest):
            return messages
        last = messages[-1]
        parts = [*last.parts, UserPromptPart(text)]
        return [*messages[:-1], dataclasses.replace(last, parts=parts)]

    def capabilities(self) -> list[AbstractCapability[Any]]:
        """`Agent(capabilities=...)`: `PrepareTools(prepare_tools)`, `ProcessHistory(snapshot)`."""
        return [PrepareTools(self.prepare_tools), ProcessHistory(self.snapshot)]

    def tools(self, handlers: Mapping[str, Handler] | Iterable[tuple[str, Handler]]) -> list[Tool]:
        """A `Tool` per handler; `prepare_tools` gives each the assembly's schema and place."""
        pairs = handlers.items() if isinstance(handlers, Mapping) else handlers
        return [
            Tool.from_schema(handler, name, None, {"type": "object"}) for name, handler in pairs
        ]
