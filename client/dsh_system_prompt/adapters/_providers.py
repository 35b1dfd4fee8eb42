"""Provider adapters: an assembly as the keyword arguments of one model call, plain JSON values.

Each function takes a `RenderedPrompt` (from `client.render`) or a `PromptAssembly` (rendered
here, strictly), the conversation's messages in the provider's own format, and returns a
`ProviderRequest` whose `params` go to the SDK's create call as keyword arguments. None of them
imports an SDK. What they keep, for every provider:

- the assembly's tool order is the order the model sees (the sidecar's order is the cached one);
- each tool's parameters are parsed from the JSON text the sidecar sent, keys in their order, so
  an SDK that serialises compactly (openai, anthropic, google-genai all do) sends the same bytes;
- the runtime-context snapshot goes after the messages, past every cached part, so a turn's new
  facts never break the prefix (the system prompt, the tools, the conversation so far);
- `"{}"` parameters become `{"type": "object"}`: each of these APIs wants an object schema.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..render import render_context_snapshot, render_prompt
from ..types import PromptAssembly, RenderedPrompt, ToolSchema

Prompt = RenderedPrompt | PromptAssembly
Message = Mapping[str, Any]

#: Anthropic's cache breakpoint; `cache_ttl="1h"` adds the TTL.
EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}


@dataclass
class ProviderRequest:
    """One model call's keyword arguments, and where its usage is to be reported.

    `client.report_usage(response.usage, **request.report)` tells the sidecar what the model
    server cached, for the same scope and report key the assembly was reported under.
    """

    params: dict[str, Any]
    scope: str | None = None
    report_key: str | None = None
    report: dict[str, str | None] = field(init=False)

    def __post_init__(self) -> None:
        self.report = {"scope": self.scope, "report_key": self.report_key}


def rendered(prompt: Prompt) -> tuple[str, str]:
    """The prompt text and the runtime-context snapshot (rendered here for an assembly)."""
    if isinstance(prompt, RenderedPrompt):
        return prompt.prompt, prompt.context_snapshot
    return render_prompt(prompt), render_context_snapshot(prompt)


def tools_of(prompt: Prompt) -> list[ToolSchema]:
    return prompt.assembly.tools if isinstance(prompt, RenderedPrompt) else prompt.tools


def parameters(tool: ToolSchema) -> dict[str, Any]:
    """The tool's JSON Schema as a new dict, keys in the order the sidecar sent them.

    The JSON text is parsed without touching `tool.parameters` (reading it would make the dict
    the truth and drop the text); an empty schema becomes `{"type": "object"}`.
    """
    text = tool.parameters_json()
    if text is None:
        text = json.dumps(tool.parameters, ensure_ascii=False, separators=(",", ":"))
    schema = json.loads(text) if text.strip() else {}
    if not isinstance(schema, dict):
        raise ValueError(f'tool "{tool.name}" parameters are not a JSON object')
    return schema or {"type": "object"}


def _function(tool: ToolSchema, strict: bool) -> dict[str, Any]:
    """OpenAI's function tool: the chat API nests it under "function", Responses does not."""
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": parameters(tool),
        "strict": strict,
    }


def openai_chat(
    prompt: Prompt,
    messages: Iterable[Message] = (),
    *,
    strict: bool = False,
    system_role: Literal["system", "developer"] = "system",
    scope: str | None = None,
    report_key: str | None = None,
) -> ProviderRequest:
    """OpenAI Chat Completions: `client.chat.completions.create(model=..., **request.params)`.

    The prompt is the first message (`system_role`), the snapshot a user message after
    `messages`; tools are `{"type": "function", "function": {...}}` with `strict` as given.
    """
    text, snapshot = rendered(prompt)
    sent: list[dict[str, Any]] = [{"role": system_role, "content": text}] if text else []
    sent += [dict(message) for message in messages]
    if snapshot:
        sent.append({"role": "user", "content": snapshot})
    params: dict[str, Any] = {"messages": sent}
    tools = [{"type": "function", "function": _function(tool, strict)} for tool in tools_of(prompt)]
    if tools:  # the API refuses an empty list
        params["tools"] = tools
    return ProviderRequest(params, scope, report_key)


def openai_responses(
    prompt: Prompt,
    input: Iterable[Message] = (),
    *,
    strict: bool = False,
    scope: str | None = None,
    report_key: str | None = None,
) -> ProviderRequest:
    """OpenAI Responses: `client.responses.create(model=..., **request.params)`.

    The prompt is `instructions`, the snapshot a user message after `input`; tools are
    `{"type": "function", "name", "description", "parameters", "strict"}`.
    """
    text, snapshot = rendered(prompt)
    items = [dict(item) for item in input]
    if snapshot:
        items.append({"role": "user", "content": snapshot})
    params: dict[str, Any] = {"input": items}
    if text:
        params["instructions"] = text
    tools = [{"type": "function", **_function(tool, strict)} for tool in tools_of(prompt)]
    if tools:
        params["tools"] = tools
    return ProviderRequest(params, scope, report_key)


def anthropic_messages(
    prompt: Prompt,
    messages: Iterable[Message] = (),
    *,
    strict: bool = False,
    cache: bool = True,
    cache_ttl: Literal["5m", "1h"] | None = None,
    scope: str | None = None,
    report_key: str | None = None,
) -> ProviderRequest:
    """Anthropic Messages: `client.messages.create(model=..., max_tokens=..., **request.params)`.

    The prompt is one system text block and tools carry `input_schema`. With `cache` (the
    default) the last tool and the last system block carry `cache_control`: the API caches
    tools, then system, then messages, so the two breakpoints hold the assembly's prefix and the
    snapshot, a user message after `messages`, comes after both. `strict` is sent only when set.
    """
    text, snapshot = rendered(prompt)
    control = {**EPHEMERAL, "ttl": cache_ttl} if cache_ttl else dict(EPHEMERAL)
    params: dict[str, Any] = {}
    tools: list[dict[str, Any]] = []
    for tool in tools_of(prompt):
        entry: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": parameters(tool),
        }
        if strict:
            entry["strict"] = True
        tools.append(entry)
    if tools:
        if cache:
            tools[-1]["cache_control"] = control
        params["tools"] = tools
    if text:
        block: dict[str, Any] = {"type": "text", "text": text}
        if cache:
            block["cache_control"] = dict(control)
        params["system"] = [block]
    sent = [dict(message) for message in messages]
    if snapshot:
        sent.append({"role": "user", "content": [{"type": "text", "text": snapshot}]})
    params["messages"] = sent
    return ProviderRequest(params, scope, report_key)


def gemini(
    prompt: Prompt,
    contents: Iterable[Message] = (),
    *,
    scope: str | None = None,
    report_key: str | None = None,
) -> ProviderRequest:
    """Gemini (google-genai): `client.models.generate_content(model=..., **request.params)`.

    The prompt is `config.system_instruction`, tools one `Tool` of `function_declarations`
    whose schemas are `parameters_json_schema` (JSON Schema as given, not Gemini's own
    `Schema`), the snapshot a user content after `contents`.
    """
    text, snapshot = rendered(prompt)
    sent = [dict(content) for content in contents]
    if snapshot:
        sent.append({"role": "user", "parts": [{"text": snapshot}]})
    config: dict[str, Any] = {}
    if text:
        config["system_instruction"] = text
    declarations = [
        {
            "name": tool.name,
            "description": tool.description,
            "parameters_json_schema": parameters(tool),
        }
        for tool in tools_of(prompt)
    ]
    if declarations:
        config["tools"] = [{"function_declarations": declarations}]
    return ProviderRequest({"contents": sent, "config": config}, scope, report_key)
