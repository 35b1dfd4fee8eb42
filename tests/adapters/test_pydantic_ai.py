"""pydantic-ai's agent on its FunctionModel: each model request gets its own assembly's
instructions, tools (in the assembly's order, its schemas, not strict) and snapshot."""

from __future__ import annotations

import json
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt.adapters.pydantic_ai import PydanticAIPrompt
from model_calls import BASH_JSON, ORDER, PROMPT, SNAPSHOT
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel


async def test_each_request_is_assembled_with_its_tools_in_order(agent: dsp.Client) -> None:
    seen: list[tuple[AgentInfo, list[ModelMessage]]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append((info, messages))
        if len(seen) == 1:
            return ModelResponse(parts=[ToolCallPart("bash", {"command": "ls"})])
        return ModelResponse(parts=[TextPart("Looks fine.")])

    async def drop_clock(
        assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: dsp.Next
    ) -> dsp.PromptAssembly:
        assembly.tools = [tool for tool in assembly.tools if tool.name != "clock"]
        return await next_()

    ran: list[dict[str, Any]] = []

    async def bash(**arguments: Any) -> str:
        ran.append(arguments)
        await agent.section("later", 20, "Tools have run.")
        await agent.on_assemble(drop_clock)
        return "README.md"

    async def unused(**arguments: Any) -> str:
        raise AssertionError("not called")

    prompt = PydanticAIPrompt(agent, fields={"cwd": "/work"})
    # registered in another order than the assembly's: prepare_tools puts them in its order
    handlers = {"clock": unused, "apply_patch": unused, "bash": bash, "unassembled": unused}
    reviewer = Agent(
        FunctionModel(model),
        instructions=prompt.instructions,
        tools=prompt.tools(handlers),
        capabilities=prompt.capabilities(),
    )
    result = await reviewer.run("Review the patch.")

    assert result.output == "Looks fine."
    assert ran == [{"command": "ls"}]
    (first, first_messages), (second, second_messages) = seen
    assert first.instructions == PROMPT
    assert [tool.name for tool in first.function_tools] == ORDER
    bash_tool = first.function_tools[0]
    assert (
        json.dumps(bash_tool.parameters_json_schema, separators=(",", ":"), ensure_ascii=False)
        == BASH_JSON
    )
    assert (bash_tool.description, bash_tool.strict) == ("Run a shell command.", False)
    assert first.function_tools[2].parameters_json_schema == {"type": "object"}
    last = first_messages[-1]
    assert isinstance(last, ModelRequest)
    assert [part.content for part in last.parts if isinstance(part, UserPromptPart)] == [
        "Review the patch.",
        SNAPSHOT,
    ]
    # assembled again for the second request: the new section, no clock, the snapshot last
    assert second.instructions == f"{PROMPT}\n\nTools have run."
    assert [tool.name for tool in second.function_tools] == ["bash", "apply_patch"]
    last = second_messages[-1]
    assert isinstance(last, ModelRequest)
    assert isinstance(last.parts[-1], UserPromptPart) and last.parts[-1].content == SNAPSHOT
