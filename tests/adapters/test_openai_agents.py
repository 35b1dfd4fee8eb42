"""openai-agents' runner, its Responses model on the openai SDK's mock transport: each model
call carries its own turn's assembly (instructions, enabled tools, snapshot last) with the
sidecar's schema bytes, unrewritten (strict_json_schema=False)."""

from __future__ import annotations

import json
from typing import Any

import dsh_system_prompt as dsp
import httpx2
import openai
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner
from dsh_system_prompt.adapters.openai_agents import AgentsPrompt
from model_calls import (
    BASH_JSON,
    ORDER,
    PROMPT,
    REPORT_KEY,
    SNAPSHOT,
    responses_reply,
    text_output,
)

SCRIPT = [
    responses_reply(
        [
            {
                "type": "function_call",
                "id": "fc1",
                "call_id": "call_1",
                "name": "bash",
                "arguments": '{"command":"ls"}',
                "status": "completed",
            }
        ]
    ),
    responses_reply(text_output("Looks fine.")),
]


async def test_each_turn_is_assembled_and_sent_with_the_sidecar_schema_bytes(
    agent: dsp.Client,
) -> None:
    bodies: list[bytes] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        bodies.append(request.read())
        return httpx2.Response(200, json=SCRIPT[len(bodies) - 1])

    openai_client = openai.AsyncOpenAI(
        api_key="k",
        base_url="http://model.test/v1",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(answer)),
    )
    prompt = AgentsPrompt(agent, fields={"cwd": "/work"}, report_key=REPORT_KEY)
    ran: list[dict[str, Any]] = []

    async def drop_clock(
        assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: dsp.Next
    ) -> dsp.PromptAssembly:
        assembly.tools = [tool for tool in assembly.tools if tool.name != "clock"]
        return await next_()

    async def bash(**arguments: Any) -> str:
        ran.append(arguments)
        # between the two model calls: the prompt grows and the clock tool goes away
        await agent.section("later", 20, "Tools have run.")
        await agent.on_assemble(drop_clock)
        return "README.md"

    tools = await prompt.function_tools({"bash": bash, "clock": bash, "apply_patch": bash})
    assert [tool.name for tool in tools] == ORDER
    assert all(tool.strict_json_schema is False for tool in tools)

    reviewer = Agent(name="reviewer", instructions=prompt.instructions, tools=tools)
    config = RunConfig(
        model=OpenAIResponsesModel(model="m", openai_client=openai_client),
        call_model_input_filter=prompt.input_filter,
        tracing_disabled=True,
    )
    result = await Runner.run(reviewer, "Review the patch.", run_config=config)

    assert result.final_output == "Looks fine."
    assert ran == [{"command": "ls"}]
    first, second = (json.loads(body) for body in bodies)
    assert first["instructions"] == PROMPT
    assert [tool["name"] for tool in first["tools"]] == ORDER
    assert b'"parameters":' + BASH_JSON.encode() + b',"strict":false' in bodies[0]
    assert first["input"][-1] == {"role": "user", "content": SNAPSHOT}
    # the second call was assembled again: the new section, and no clock
    assert second["instructions"] == f"{PROMPT}\n\nTools have run."
    assert [tool["name"] for tool in second["tools"]] == ["bash", "apply_patch"]
    assert second["input"][-1] == {"role": "user", "content": SNAPSHOT}

    entry = await agent.report_usage(result.raw_responses[-1].usage, **prompt.report)
    assert entry.observed_cached_tokens == 64
