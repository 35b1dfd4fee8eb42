"""A small agent process that contributes to the sidecar's prompt, then stays.

    .venv/bin/python examples/python/agent.py [ADDRESS]   (default $DSP_ADDRESS, or 127.0.0.1:50051)

Run it while `make serve` runs; in another terminal try
`.venv/bin/dsh-system-prompt assemble --scope agent-1 --field cwd=/work`,
`... assemble --report`, and `... watch`. Each line typed into it replaces
agent-1's memory section (with `make serve ADMIN=127.0.0.1:8080`, watch
http://127.0.0.1:8080/prompt?scope=agent-1 change). Ctrl-C ends it: its session
closes and everything it registered disappears from the sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import signal
import sys
from collections.abc import AsyncIterator, Awaitable

import dsh_system_prompt as dsp
from dsh_system_prompt import adapters


async def main(address: str | None) -> None:
    # Started beside its sidecar (in a pod, say): wait for it to come up, 30 s at most.
    async with dsp.connect(
        address, client_name="example-agent", wait_for_ready=True, timeout=30
    ) as client:
        await client.variable("model", "deepseek-v4")
        await client.section("rules", 10, "You run on {{model}}. Be precise and brief.")
        await client.tools(
            [
                dsp.ToolSchema(
                    "bash",
                    "Run a shell command.",
                    {"type": "object", "properties": {"command": {"type": "string"}}},
                ),
                dsp.ToolSchema("read", "Read a file.", {"type": "object"}),
            ]
        )
        # Facts that change every turn go into runtime context, not the prompt.
        await client.context("clock", 10, lambda ctx: f"Now: {datetime.datetime.now():%H:%M:%S}.")
        await client.context("cwd", 20, lambda ctx: f"Working directory: {ctx.get('cwd', '/')}.")

        agent = await client.scope("agent-1")
        await agent.section("deployment:persona", 0, "You are agent 1, a careful reviewer.")
        memory = await agent.section("memory", 50, "Remember: nothing yet.")

        async def sign(
            assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: dsp.Next
        ) -> Awaitable[dsp.PromptAssembly]:
            assembly.sections.append(dsp.AssembledSection("signature", "Sign replies as agent 1."))
            return next_()  # un-awaited: the rest of the chain's result, one round trip less

        await agent.on_assemble(sign, name="sign")
        print("registered; Ctrl-C to leave", flush=True)
        rendered = await client.render(scope="agent-1", fields={"cwd": "/work"})
        print(rendered.prompt, "\n", rendered.context_snapshot, sep="\n", flush=True)
        # What a model call takes, through a provider adapter: Anthropic's Messages API here,
        # tools in the assembly's order, cache breakpoints before the runtime context.
        request = adapters.anthropic_messages(rendered, scope="agent-1")
        tools = ", ".join(tool["name"] for tool in request.params["tools"])
        print(f"as an Anthropic request: tools {tools}; report to {request.report}", flush=True)
        print("type a line to replace agent-1's memory section", flush=True)
        async for line in typed_lines():
            await memory.update(f"Remember: {line}")  # in place: one change event
        await asyncio.Event().wait()


async def typed_lines() -> AsyncIterator[str]:
    """Lines from stdin as they are typed; none when stdin is a file or closed."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError):
        return
    while line := await reader.readline():
        if line.strip():
            yield line.decode(errors="replace").strip()


if __name__ == "__main__":
    # SIGTERM leaves as Ctrl-C does. In a container the agent is PID 1, for which the kernel
    # has no default SIGTERM action: without this, a pod's stop would wait out its grace
    # period and SIGKILL it, its session never closed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
