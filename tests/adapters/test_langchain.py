"""LangChain's fake chat model, given tools as a provider's chat model is (`bind_tools`): the
system message, the tools in the assembly's order with the sidecar's schemas, the snapshot
last; and a tool call runs the handler."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt.adapters.langchain import messages, structured_tools
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from model_calls import BASH_JSON, ORDER, PROMPT, SNAPSHOT, render
from pydantic import Field


class ToolsFakeChatModel(GenericFakeChatModel):
    """The fake chat model, binding tools as the provider packages do, keeping each call."""

    calls: list[tuple[list[BaseMessage], dict[str, Any]]] = Field(default_factory=list)

    def bind_tools(
        self, tools: Sequence[dict[str, Any] | type | BaseTool | Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.calls.append((messages, kwargs))
        return super()._generate(messages, stop, run_manager, **kwargs)


def replies() -> Iterator[AIMessage]:
    yield AIMessage("", tool_calls=[{"name": "bash", "args": {"command": "ls"}, "id": "call_1"}])


async def test_the_model_gets_the_prompt_tools_and_snapshot(agent: dsp.Client) -> None:
    ran: list[dict[str, Any]] = []

    async def bash(**arguments: Any) -> str:
        ran.append(arguments)
        return "README.md"

    async def unused(**arguments: Any) -> str:
        raise AssertionError("not called")

    rendered = await render(agent)
    tools = structured_tools(
        rendered, {"clock": unused, "bash": bash, "apply_patch": unused, "absent": unused}
    )
    assert [tool.name for tool in tools] == ORDER
    chat = ToolsFakeChatModel(messages=replies())
    history = [HumanMessage("Review the patch.")]
    reply = await chat.bind_tools(tools).ainvoke(messages(rendered, history))

    [(sent, kwargs)] = chat.calls
    assert [(type(message), message.content) for message in sent] == [
        (SystemMessage, PROMPT),
        (HumanMessage, "Review the patch."),
        (HumanMessage, SNAPSHOT),
    ]
    assert [tool["function"]["name"] for tool in kwargs["tools"]] == ORDER
    schema = kwargs["tools"][0]["function"]["parameters"]
    assert json.dumps(schema, ensure_ascii=False, separators=(",", ":")) == BASH_JSON
    assert kwargs["tools"][2]["function"]["parameters"] == {"type": "object"}

    [call] = reply.tool_calls
    assert await tools[0].ainvoke(call["args"]) == "README.md"
    assert ran == [{"command": "ls"}]
