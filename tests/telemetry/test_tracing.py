"""OpenTelemetry traces: one tree per assembly, from the caller through the sidecar to the
processes that answer for providers and listeners, in process (in-memory exporter) and across
processes (OTLP to a receiver built here on the official OTLP protos)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import dsh_system_prompt as dsp
import grpc.aio
import pytest
from dsh_system_prompt_server import Sidecar, parse_config, start_sidecar
from dsh_system_prompt_server.telemetry.tracing import Tracing, tracing_from_env
from helpers import eventually
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from processes import serve

ASSEMBLE = "/dsh.systemprompt.v1.SystemPromptService/Assemble"
AGENT = Path(__file__).parent / "traced_agent.py"


@dataclass(frozen=True)
class Node:
    """One span of a trace, as the tree needs it."""

    span_id: int
    parent_id: int | None
    name: str
    service: str
    start: int


def tree(nodes: Sequence[Node]) -> list[str]:
    """The trace as indented lines `name [service]`, children in start order."""
    ids = {node.span_id for node in nodes}
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        children = [n for n in nodes if (n.parent_id if n.parent_id in ids else None) == parent]
        for node in sorted(children, key=lambda n: n.start):
            lines.append(f"{'  ' * depth}{node.name} [{node.service}]")
            walk(node.span_id, depth + 1)

    walk(None, 0)
    return lines


# -- in one process: the SDK's in-memory exporter ----------------------------------------

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def provider() -> TracerProvider:
    """The process's tracer provider (set once), recording into memory."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    current.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return current


@pytest.fixture
async def traced_sidecar(provider: TracerProvider) -> AsyncIterator[Sidecar]:
    _EXPORTER.clear()
    sidecar = await start_sidecar(parse_config({}), "127.0.0.1:0", Tracing(provider))
    yield sidecar
    await sidecar.server.stop(grace=None)


def nodes_of(spans: Sequence[ReadableSpan], trace_id: int) -> list[Node]:
    return [
        Node(
            span.context.span_id,
            span.parent.span_id if span.parent else None,
            span.name,
            str(span.resource.attributes.get("service.name", "")),
            span.start_time or 0,
        )
        for span in spans
        if span.context is not None and span.context.trace_id == trace_id
    ]


async def sign(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
) -> dsp.PromptAssembly:
    return await next_()


async def traced_assembly(client: dsp.Client) -> int:
    """Assemble inside a caller's span; its trace id."""
    with trace.get_tracer("test").start_as_current_span("agent turn") as turn:
        await client.assemble()
    return turn.get_span_context().trace_id


async def test_an_assembly_is_one_span_tree_through_providers_and_listeners(
    traced_sidecar: Sidecar,
) -> None:
    async with dsp.connect(traced_sidecar.address) as client:
        await client.section("clock", 5, lambda ctx: "Now.")
        await client.on_assemble(sign, name="sign")
        trace_id = await traced_assembly(client)
    expected = [
        "agent turn",
        f"  {ASSEMBLE}",
        '    section provider "clock" (global)',
        '      section provider "clock"',
        '    listener "sign"',
        '      listener "sign"',
    ]

    def spans() -> list[str]:  # one process: one service name, left out
        found = nodes_of(_EXPORTER.get_finished_spans(), trace_id)
        return [line.split(" [")[0] for line in tree(found)]

    await eventually(lambda: spans() == expected, "the span tree")


async def test_a_rule_is_a_span_of_its_own_between_the_listeners_it_runs_among(
    traced_sidecar: Sidecar,
) -> None:
    async with dsp.connect(traced_sidecar.address) as client:
        await client.on_assemble(sign, name="sign")
        note = dsp.Mutation.upsert_sections(dsp.RulePart("note", 1, "'Noted.'"))
        await client.rule("noter", dsp.Rule([note]))
        trace_id = await traced_assembly(client)
    expected = [
        "agent turn",
        f"  {ASSEMBLE}",
        '    listener "sign"',
        '      listener "sign"',
        '      rule "noter"',
    ]

    def spans() -> list[str]:
        found = nodes_of(_EXPORTER.get_finished_spans(), trace_id)
        return [line.split(" [")[0] for line in tree(found)]

    await eventually(lambda: spans() == expected, "the span tree")


async def test_listener_hops_nest_as_the_chain_runs(traced_sidecar: Sidecar) -> None:
    async with dsp.connect(traced_sidecar.address) as client:
        await client.on_assemble(sign, name="outer")
        await client.on_assemble(sign, name="inner")
        trace_id = await traced_assembly(client)

    def hops() -> list[str]:
        lines = tree(nodes_of(_EXPORTER.get_finished_spans(), trace_id))
        return [line.split(" [")[0] for line in lines if "listener" in line]

    await eventually(
        lambda: (
            hops()
            == [
                '    listener "outer"',
                '      listener "outer"',
                '      listener "inner"',
                '        listener "inner"',
            ]
        ),
        "inner nested in outer",
    )


async def test_a_sidecar_that_does_not_trace_sends_no_trace_context(
    provider: TracerProvider, make_sidecar: object
) -> None:
    _EXPORTER.clear()
    sidecar = await start_sidecar(parse_config({}), "127.0.0.1:0")  # no tracing
    try:
        async with dsp.connect(sidecar.address) as client:
            await client.section("clock", 5, lambda ctx: "Now.")
            trace_id = await traced_assembly(client)
    finally:
        await sidecar.server.stop(grace=None)
    assert [n.name for n in nodes_of(_EXPORTER.get_finished_spans(), trace_id)] == ["agent turn"]


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_off_unless_otel_variables_ask_for_an_exporter(
    environ: dict[str, str], on: bool
) -> None:
    tracing = tracing_from_env(environ)
    assert (tracing is not None) is on
    if tracing is not None:
        tracing.provider.shutdown()


# -- across processes: OTLP to a receiver on the official protos ------------------------


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP trace receiver: keeps every span it is sent, with its service's name."""

    def __init__(self) -> None:
        self.nodes: dict[str, list[Node]] = {}  # by trace id, hex

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            service = attributes.get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    parent = int.from_bytes(span.parent_span_id, "big") or None
                    self.nodes.setdefault(span.trace_id.hex(), []).append(
                        Node(
                            int.from_bytes(span.span_id, "big"),
                            parent,
                            span.name,
                            service,
                            span.start_time_unix_nano,
                        )
                    )
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    server = grpc.aio.server()
    collected = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collected, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield collected, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


@contextlib.contextmanager
def otlp_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> Iterator[None]:
    """Every process started from here exports to `endpoint` without delay."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    yield


async def agent(role: str, address: str) -> asyncio.subprocess.Process:
    """Start traced_agent.py as `role` (its own service name); returns once it is ready."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(AGENT),
        role,
        address,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=_env(OTEL_SERVICE_NAME=f"agent-{role}"),
    )
    assert process.stdout is not None
    if role != "caller":
        assert (await asyncio.wait_for(process.stdout.readline(), 30)) == b"ready\n"
    return process


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, **more}


CROSS_PROCESS_TREE = [
    "agent turn [agent-caller]",
    f"  {ASSEMBLE} [dsh-system-prompt]",
    '    section provider "clock" (global) [dsh-system-prompt]',
    '      section provider "clock" [agent-provider]',
    '    listener "sign" [dsh-system-prompt]',
    '      listener "sign" [agent-listener]',
]


@pytest.mark.timeout(120)
async def test_one_trace_spans_the_caller_the_sidecar_a_provider_and_a_listener_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with receiver() as (collected, endpoint):
        with otlp_env(monkeypatch, endpoint):
            async with serve("--listen", "127.0.0.1:0") as served:
                provider = await agent("provider", served.address)
                listener = await agent("listener", served.address)
                caller = await agent("caller", served.address)
                out, _ = await asyncio.wait_for(caller.communicate(), 60)
                trace_id = out.decode().strip()
                for process in (provider, listener):
                    assert process.stdin is not None
                    process.stdin.close()  # the agent leaves, flushing its spans
                    assert await asyncio.wait_for(process.wait(), 30) == 0
                served.process.send_signal(signal.SIGTERM)  # drains, then flushes its spans
                assert await asyncio.wait_for(served.process.wait(), 30) == 0

        def spans() -> list[str]:
            return tree(collected.nodes.get(trace_id, []))

        await eventually(lambda: spans() == CROSS_PROCESS_TREE, "the cross-process tree", 20)
    print("\n".join(spans()))  # the dump docs/operations.md shows


@contextlib.asynccontextmanager
async def silent_collector() -> AsyncIterator[str]:
    """A TCP port that accepts connections and never answers: a collector that hangs."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()


@pytest.mark.timeout(60)
async def test_sigterm_ends_within_the_grace_period_when_the_collector_never_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("shutdown_grace_s = 1\n")
    async with silent_collector() as endpoint:
        with otlp_env(monkeypatch, endpoint):
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "40")  # the exporter's own bound
            async with serve("--listen", "127.0.0.1:0", "--config", str(config)) as served:
                async with dsp.connect(served.address) as client:
                    await client.assemble()  # a span to export
                served.process.send_signal(signal.SIGTERM)
                # Generous, yet far below the exporter's 40 s: the drain gave up on it.
                assert await asyncio.wait_for(served.process.wait(), 20) == 0
                assert "span export still pending" in served.logs()
