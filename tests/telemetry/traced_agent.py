"""An agent process that traces (OpenTelemetry SDK, OTLP exporter from OTEL_* variables),
for the cross-process trace test. Run as `python traced_agent.py ROLE ADDRESS`:

- provider: registers a dynamic section "clock", prints "ready", serves until stdin closes;
- listener: installs listener "sign", prints "ready", serves until stdin closes;
- caller: assembles inside its span "agent turn" and prints that span's trace id.

Each flushes its spans before it exits.
"""

from __future__ import annotations

import asyncio
import sys

import dsh_system_prompt as dsp
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


async def sign(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
) -> dsp.PromptAssembly:
    assembly.sections.append(dsp.AssembledSection("signature", "Signed."))
    return await next_()


async def main(role: str, address: str) -> None:
    async with dsp.connect(address, wait_for_ready=True, timeout=20) as client:
        if role == "caller":
            tracer = trace.get_tracer("traced_agent")
            with tracer.start_as_current_span("agent turn") as turn:
                await client.assemble(fields={"now": "12:00"})
            print(format(turn.get_span_context().trace_id, "032x"), flush=True)
            return
        if role == "provider":
            await client.section("clock", 5, lambda ctx: f"Now: {ctx.get('now')}.")
        else:
            await client.on_assemble(sign, name="sign")
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    provider = TracerProvider()  # service.name from OTEL_SERVICE_NAME
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    try:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    finally:
        provider.shutdown()
