"""LangChain (langchain-core): the assembly as a system message, structured tools and a snapshot.

    rendered = await client.render(scope, report=True, report_key="conv-7")
    model = chat_model.bind_tools(structured_tools(rendered, handlers))
    reply = await model.ainvoke(messages(rendered, history))

`messages` puts the prompt first as a `SystemMessage` and the runtime-context snapshot last as a
`HumanMessage`, after the history; `structured_tools` gives a `StructuredTool` per assembled
tool that has a handler, in the assembly's order, whose `args_schema` is the sidecar's JSON
Schema as it was sent (no pydantic model in between, so `bind_tools` passes it on unchanged).
Importing this module imports `langchain_core`; the client never does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import StructuredTool

from ._providers import Prompt, parameters, rendered, tools_of

Handler = Callable[..., Awaitable[Any]]
"""A tool's implementation, called with the model's arguments as keywords."""


def messages(prompt: Prompt, history: Iterable[BaseMessage] = ()) -> list[BaseMessage]:
    """The prompt as the system message, then `history`, then the snapshot (when any)."""
    text, snapshot = rendered(prompt)
    sent: list[BaseMessage] = [SystemMessage(text)] if text else []
    sent += history
    if snapshot:
        sent.append(HumanMessage(snapshot))
    return sent


def structured_tools(prompt: Prompt, handlers: Mapping[str, Handler]) -> list[StructuredTool]:
    """A `StructuredTool` for each assembled tool with a handler, in the assembly's order."""
    return [
        StructuredTool.from_function(
            coroutine=handlers[tool.name],
            name=tool.name,
            description=tool.description,
            args_schema=parameters(tool),
            infer_schema=False,
        )
        for tool in tools_of(prompt)
        if tool.name in handlers
    ]
