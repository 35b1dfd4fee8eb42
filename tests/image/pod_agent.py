"""An agent for the image tests, run in the pod's agent container by the image's Python.

    python pod_agent.py          (connects to $DSP_ADDRESS, as the manifests' agent does)

It registers a prompt in scope agent-1 (a variable, sections, tools, a listener, and a
memory section it updates in place) and a slow context in scope "slow", prints
{"ready": true}, then answers one JSON line per command read from stdin:

    render          {"prompt": ...}: agent-1's rendered prompt (waits out a reconnect)
    remember TEXT   {"remembered": TEXT}: the memory section updated in place
    slow N          {"started": N} once N assemblies of "slow" are inside its provider,
                    then {"finished": [...]}: each one's context text, or its error
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable
from typing import Any

import dsh_system_prompt as dsp

SLOW_S = 2.0  # under the ConfigMap's shutdown_grace_s (5) and provider_timeout_s (5)


def say(**message: Any) -> None:
    print(json.dumps(message), flush=True)


class Agent:
    def __init__(self, client: dsp.Client) -> None:
        self.client = client
        self.memory: dsp.Handle | None = None
        self.inside = 0
        self.all_inside = asyncio.Event()
        self.expected = 0

    async def register(self) -> None:
        client = self.client
        await client.variable("model", "deepseek-v4")
        await client.section("rules", 10, "You run on {{model}}. Be precise and brief.")
        await client.tools([dsp.ToolSchema("read", "Read a file.", {"type": "object"})])
        agent = await client.scope("agent-1")
        await agent.section("role", 5, "You are agent 1, in a pod.")
        self.memory = await agent.section("memory", 50, "Remember: nothing yet.")

        async def sign(
            assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: dsp.Next
        ) -> Awaitable[dsp.PromptAssembly]:
            assembly.sections.append(dsp.AssembledSection("signature", "Sign as agent 1."))
            return next_()

        await agent.on_assemble(sign, name="sign")
        slow = await client.scope("slow")
        await slow.context("slow", 10, self.slow_provider)

    async def slow_provider(self, ctx: dsp.AssembleContext) -> str:
        # Counts the assemblies that are inside it, so the test sends SIGTERM only once
        # all of them are in flight.
        self.inside += 1
        if self.inside >= self.expected:
            self.all_inside.set()
        await asyncio.sleep(SLOW_S)
        return f"Slow context, {SLOW_S} s."

    async def render(self) -> None:
        rendered = await self.client.render(scope="agent-1", timeout=30)
        say(prompt=rendered.prompt)

    async def slow(self, count: int) -> None:
        self.inside, self.expected = 0, count
        self.all_inside.clear()
        calls = [asyncio.ensure_future(self.client.render(scope="slow")) for _ in range(count)]
        await asyncio.wait_for(self.all_inside.wait(), 10)
        say(started=count)
        finished = []
        for outcome in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(outcome, BaseException):
                finished.append(f"error: {outcome}")
            else:
                finished.append(outcome.context_snapshot)
        say(finished=finished)

    async def command(self, line: str) -> None:
        verb, _, rest = line.partition(" ")
        if verb == "render":
            await self.render()
        elif verb == "remember":
            assert self.memory is not None
            await self.memory.update(f"Remember: {rest}")
            say(remembered=rest)
        elif verb == "slow":
            await self.slow(int(rest))
        else:
            say(error=f"unknown command {line!r}")


async def main() -> None:
    async with dsp.connect(client_name="pod-agent", wait_for_ready=True, timeout=30) as client:
        agent = Agent(client)
        await agent.register()
        say(ready=True)
        loop = asyncio.get_running_loop()
        while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
            await agent.command(line)


if __name__ == "__main__":
    asyncio.run(main())
