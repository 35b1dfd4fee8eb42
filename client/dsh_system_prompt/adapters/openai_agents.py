"""openai-agents: instructions assembled per model call, tools from the assembly.

    prompt = AgentsPrompt(client, scope="agent-1", report_key="conv-7")
    agent = Agent(name="a", instructions=prompt.instructions,
                  tools=await prompt.function_tools({"bash": run_bash}))
    config = RunConfig(call_model_input_filter=prompt.input_filter)
    await Runner.run(agent, "...", run_config=config)

Each model call of a run gets the assembly of that turn (assembled once, shared by the
instructions, the tools' `is_enabled` and the input filter): its rendered prompt is the
instructions, a tool the turn's assembly leaves out is disabled, and the runtime-context
snapshot is appended to the model's input. The tools are `FunctionTool`s with
`strict_json_schema=False`, so the SDK sends each schema as the sidecar has it instead of
rewriting it for strict mode, in the assembly's order as of `function_tools()`. Importing this
module imports `agents`; the client never does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agents import Agent, FunctionTool, RunContextWrapper
from agents.run_config import CallModelData, ModelInputData
from agents.tool_context import ToolContext

from ..types import RenderedPrompt
from ._providers import parameters
from ._turns import Turns

Handler = Callable[..., Awaitable[Any]]
"""A tool's implementation, called with the model's arguments as keywords; its output is
anything `str()` takes (as the other framework adapters' handlers)."""


class AgentsPrompt(Turns):
    """The registry's prompt and tools for an `agents.Agent`, one assembly per model call."""

    def turn(
        self, run_context: RunContextWrapper[Any], *, fresh: bool = False
    ) -> Awaitable[RenderedPrompt]:
        """The assembly of the run's next model call.

        The runner asks for the tools (each tool's `is_enabled`, at once), then the
        instructions, then calls the model; it also lists the tools after a response, before
        the tools run. So the tools (`fresh`) share an assembly only while it is being made,
        and the instructions take the latest one made since the last model call.
        """
        return self._assembled((id(run_context), run_context.usage.requests), fresh=fresh)

    async def instructions(self, run_context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        """`Agent(instructions=...)`: the turn's rendered prompt."""
        return (await self.turn(run_context)).prompt

    async def input_filter(self, data: CallModelData[Any]) -> ModelInputData:
        """`RunConfig(call_model_input_filter=...)`: the turn's snapshot after the input."""
        # The filter runs after the turn's instructions and tools (and is given no run context).
        rendered = await (self.render() if self._turn is None else asyncio.shield(self._turn[1]))
        model_data = data.model_data
        if rendered.context_snapshot:
            snapshot = {"role": "user", "content": rendered.context_snapshot}
            model_data.input = [*model_data.input, snapshot]  # type: ignore[list-item]
        return model_data

    async def function_tools(self, handlers: Mapping[str, Handler]) -> list[FunctionTool]:
        """A `FunctionTool` for each assembled tool with a handler, in the assembly's order.

        Each is enabled on a turn whose assembly has it; a handler whose tool is not
        assembled now gets no tool (build the list again when tools are added).
        """
        assembled = (await self.render()).assembly.tools
        return [
            FunctionTool(
                name=tool.name,
                description=tool.description,
                params_json_schema=parameters(tool),
                on_invoke_tool=_invoke(handlers[tool.name]),
                strict_json_schema=False,
                is_enabled=self._enabled(tool.name),
            )
            for tool in assembled
            if tool.name in handlers
        ]

    def _enabled(self, name: str) -> Callable[[RunContextWrapper[Any], Any], Awaitable[bool]]:
        async def enabled(run_context: RunContextWrapper[Any], agent: Any) -> bool:
            rendered = await self.turn(run_context, fresh=True)
            return any(tool.name == name for tool in rendered.assembly.tools)

        return enabled


def _invoke(handler: Handler) -> Callable[[ToolContext[Any], str], Awaitable[Any]]:
    async def invoke(context: ToolContext[Any], arguments: str) -> Any:
        return await handler(**(json.loads(arguments) if arguments else {}))

    return invoke
