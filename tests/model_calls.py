"""What the adapters' tests share: a loaded sidecar's prompt, tools and an SDK's mock wire."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import dsh_system_prompt as dsp
import httpx2
import openai
from helpers import SidecarFactory

# Keys in no sorted order, a nested object, a non-ASCII string and a markup character: the
# JSON text the sidecar sends, byte for byte, is what each SDK must put on the wire.
BASH = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "description": "À exécuter <tel quel>"},
        "timeout": {"type": "integer", "minimum": 1, "default": 30},
    },
    "required": ["command"],
    "additionalProperties": False,
}
TOOLS = [
    dsp.ToolSchema("apply_patch", "Apply a patch.", {"type": "object"}),
    dsp.ToolSchema("bash", "Run a shell command.", BASH),
    dsp.ToolSchema("clock", "Tell the time.", {}),
]
# The config's tool_order puts bash first: the assembly's order is neither the registration
# order nor the sorted one.
ORDER = ["bash", "apply_patch", "clock"]
BASH_JSON = json.dumps(BASH, ensure_ascii=False, separators=(",", ":"))
PROMPT = "You are a careful reviewer on deepseek-v4."
SNAPSHOT = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
    "\n\nWorking directory: /work."
)
REPORT_KEY = "conv-7"


async def loaded_client(make_sidecar: SidecarFactory) -> AsyncIterator[dsp.Client]:
    sidecar = await make_sidecar(
        include_harness_identity=False, tool_order=["bash", dsp.TOOL_ORDER_REST]
    )
    async with dsp.connect(sidecar.address) as client:
        await client.variable("model", "deepseek-v4")
        await client.section("rules", 10, "You are a careful reviewer on {{model}}.")
        await client.context("cwd", 10, lambda ctx: f"Working directory: {ctx.get('cwd')}.")
        await client.tools(TOOLS)
        yield client


async def render(client: dsp.Client) -> dsp.RenderedPrompt:
    return await client.render(fields={"cwd": "/work"}, report=True, report_key=REPORT_KEY)


class Wire:
    """An SDK's mock transport: keeps each request's body and answers with `reply`."""

    def __init__(self, reply: dict[str, Any]) -> None:
        self.reply = reply
        self.bodies: list[bytes] = []
        self.paths: list[str] = []

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.bodies.append(request.read())
        self.paths.append(request.url.path)
        return httpx2.Response(200, json=self.reply)

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            api_key="k", base_url="http://model.test/v1", http_client=self.client()
        )

    @property
    def body(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.bodies[-1])
        return value


def responses_reply(output: list[dict[str, Any]]) -> dict[str, Any]:
    """A Responses API answer with `output`: 120 prompt tokens, 64 of them cached."""
    return {
        "id": "r1",
        "object": "response",
        "created_at": 0,
        "model": "m",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 122,
        },
    }


def text_output(text: str) -> list[dict[str, Any]]:
    """A Responses API output of one assistant message."""
    return [
        {
            "type": "message",
            "id": "m1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]
