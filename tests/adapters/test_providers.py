"""Each provider adapter's request, sent by the provider's real SDK through its mock
transport: the bytes on the wire carry the prompt, the tools in the assembly's order with the
sidecar's schema bytes, the snapshot after the messages, the cache breakpoints; the usage that
comes back is reported for the adapter's report key."""

from __future__ import annotations

import json

import anthropic
import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt import adapters
from google import genai
from google.genai import types as genai_types
from model_calls import (
    BASH,
    BASH_JSON,
    ORDER,
    PROMPT,
    REPORT_KEY,
    SNAPSHOT,
    Wire,
    render,
    responses_reply,
    text_output,
)

HISTORY = [{"role": "user", "content": "Review the patch."}]

CHAT_REPLY = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {
        "prompt_tokens": 120,
        "completion_tokens": 2,
        "total_tokens": 122,
        "prompt_tokens_details": {"cached_tokens": 64},
    },
}


async def test_openai_chat_sends_the_prompt_tools_and_schema_bytes(agent: dsp.Client) -> None:
    wire = Wire(CHAT_REPLY)
    model = wire.openai()
    request = adapters.openai_chat(await render(agent), HISTORY, report_key=REPORT_KEY)
    response = await model.chat.completions.create(model="m", **request.params)

    body = wire.body
    assert wire.paths == ["/v1/chat/completions"]
    assert body["messages"] == [
        {"role": "system", "content": PROMPT},
        *HISTORY,
        {"role": "user", "content": SNAPSHOT},
    ]
    assert [tool["function"]["name"] for tool in body["tools"]] == ORDER
    assert all(tool["function"]["strict"] is False for tool in body["tools"])
    assert b'"parameters":' + BASH_JSON.encode() + b',"strict":false' in wire.bodies[0]
    assert body["tools"][2]["function"]["parameters"] == {"type": "object"}  # was "{}"

    assert response.usage is not None
    entry = await agent.report_usage(response.usage, **request.report)
    assert (entry.observed_cached_tokens, entry.observed_prompt_tokens) == (64, 120)


async def test_strict_is_settable_and_the_system_role_too(agent: dsp.Client) -> None:
    wire = Wire(CHAT_REPLY)
    model = wire.openai()
    request = adapters.openai_chat(await render(agent), strict=True, system_role="developer")
    await model.chat.completions.create(model="m", **request.params)
    assert wire.body["messages"][0] == {"role": "developer", "content": PROMPT}
    assert all(tool["function"]["strict"] is True for tool in wire.body["tools"])


async def test_openai_responses_sends_instructions_and_flat_tools(agent: dsp.Client) -> None:
    wire = Wire(responses_reply(text_output("ok")))
    model = wire.openai()
    request = adapters.openai_responses(await render(agent), HISTORY, report_key=REPORT_KEY)
    response = await model.responses.create(model="m", **request.params)

    body = wire.body
    assert wire.paths == ["/v1/responses"]
    assert body["instructions"] == PROMPT
    assert body["input"] == [*HISTORY, {"role": "user", "content": SNAPSHOT}]
    assert [(tool["type"], tool["name"]) for tool in body["tools"]] == [
        ("function", name) for name in ORDER
    ]
    assert b'"parameters":' + BASH_JSON.encode() + b',"strict":false' in wire.bodies[0]
    assert body["tools"][2]["parameters"] == {"type": "object"}

    assert response.usage is not None
    entry = await agent.report_usage(response.usage, **request.report)
    assert (entry.observed_cached_tokens, entry.observed_prompt_tokens) == (64, 120)


ANTHROPIC_REPLY = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 20,
        "output_tokens": 2,
        "cache_read_input_tokens": 64,
        "cache_creation_input_tokens": 36,
    },
}


async def test_anthropic_caches_the_tools_and_the_system_before_the_snapshot(
    agent: dsp.Client,
) -> None:
    wire = Wire(ANTHROPIC_REPLY)
    model = anthropic.AsyncAnthropic(
        api_key="k", base_url="http://model.test", http_client=wire.client()
    )
    request = adapters.anthropic_messages(await render(agent), HISTORY, report_key=REPORT_KEY)
    response = await model.messages.create(model="m", max_tokens=64, **request.params)

    body = wire.body
    assert wire.paths == ["/v1/messages"]
    assert body["system"] == [
        {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}
    ]
    assert [tool["name"] for tool in body["tools"]] == ORDER
    # one breakpoint on the last tool, none on the others; no strict unless asked
    assert [tool.get("cache_control") for tool in body["tools"]] == [
        None,
        None,
        {"type": "ephemeral"},
    ]
    assert not any("strict" in tool for tool in body["tools"])
    assert b'"input_schema":' + BASH_JSON.encode() + b"}" in wire.bodies[0]
    assert body["tools"][2]["input_schema"] == {"type": "object"}  # "{}" is refused there
    # the API reads tools, system, then messages: the snapshot, the last message, comes
    # after both breakpoints, so it never breaks them
    assert body["messages"] == [
        *HISTORY,
        {"role": "user", "content": [{"type": "text", "text": SNAPSHOT}]},
    ]

    entry = await agent.report_usage(response.usage, **request.report)
    assert (entry.observed_cached_tokens, entry.observed_prompt_tokens) == (64, 120)


async def test_anthropic_breakpoints_can_be_left_off_or_given_a_ttl(agent: dsp.Client) -> None:
    wire = Wire(ANTHROPIC_REPLY)
    model = anthropic.AsyncAnthropic(
        api_key="k", base_url="http://model.test", http_client=wire.client()
    )
    prompt = await render(agent)
    await model.messages.create(
        model="m", max_tokens=64, **adapters.anthropic_messages(prompt, cache=False).params
    )
    assert b"cache_control" not in wire.bodies[-1]
    request = adapters.anthropic_messages(prompt, cache_ttl="1h", strict=True)
    await model.messages.create(model="m", max_tokens=64, **request.params)
    ttl = {"type": "ephemeral", "ttl": "1h"}
    assert wire.body["system"][0]["cache_control"] == ttl
    assert wire.body["tools"][-1]["cache_control"] == ttl
    assert all(tool["strict"] is True for tool in wire.body["tools"])


async def test_gemini_sends_the_system_instruction_and_json_schemas(agent: dsp.Client) -> None:
    wire = Wire(
        {
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}
            ],
            "usageMetadata": {
                "promptTokenCount": 120,
                "cachedContentTokenCount": 64,
                "candidatesTokenCount": 2,
                "totalTokenCount": 122,
            },
        }
    )
    model = genai.Client(
        api_key="k",
        http_options=genai_types.HttpOptions(
            base_url="http://model.test", httpx_async_client=wire.client()
        ),
    )
    contents = [{"role": "user", "parts": [{"text": "Review the patch."}]}]
    request = adapters.gemini(await render(agent), contents, report_key=REPORT_KEY)
    response = await model.aio.models.generate_content(model="m", **request.params)

    body = wire.body
    assert wire.paths[0].endswith("/models/m:generateContent")
    assert body["systemInstruction"]["parts"] == [{"text": PROMPT}]
    declarations = body["tools"][0]["functionDeclarations"]
    assert [declaration["name"] for declaration in declarations] == ORDER
    assert body["contents"] == [*contents, {"role": "user", "parts": [{"text": SNAPSHOT}]}]
    # google-genai writes JSON with json.dumps' defaults (spaces, ASCII escapes) and passes the
    # schema through under its own name: its keys keep the sidecar's order, the same every turn
    assert b'"parameters_json_schema": ' + json.dumps(BASH).encode() in wire.bodies[0]
    assert json.dumps(BASH, ensure_ascii=False, separators=(",", ":")) == BASH_JSON
    assert declarations[2]["parameters_json_schema"] == {"type": "object"}

    entry = await agent.report_usage(response.usage_metadata, **request.report)
    assert (entry.observed_cached_tokens, entry.observed_prompt_tokens) == (64, 120)


async def test_an_assembly_is_rendered_here_and_a_missing_snapshot_sends_nothing(
    agent: dsp.Client,
) -> None:
    assembly = await agent.assemble(fields={"cwd": "/work"})
    assert adapters.openai_chat(assembly).params == adapters.openai_chat(await render(agent)).params
    await agent.suppress_runtime_context()
    bare = adapters.anthropic_messages(await agent.assemble(), HISTORY)
    assert bare.params["messages"] == HISTORY
    assert bare.report == {"scope": None, "report_key": None}


def test_a_schema_that_is_not_an_object_is_refused() -> None:
    tool = dsp.ToolSchema.from_json("odd", "", "[1]")
    with pytest.raises(ValueError, match='tool "odd" parameters are not a JSON object'):
        adapters.parameters(tool)
    assert tool.parameters_json() == "[1]"  # reading it did not parse the tool's own copy
