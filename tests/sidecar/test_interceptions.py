"""What every call passes through, in one order built once (sidecar/app.py's
`interceptions`): its span, the credential it presents, its client's share of the loop
(a refused call's too), its refusal or the policy, its request parsed; and each of them
around every kind of method, health's and reflection's too, whatever shape their behaviour
has (a coroutine, a reader/writer stream, a response generator)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar, parse_config, start_sidecar
from dsh_system_prompt_server.telemetry import Tracing
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import eventually, raw_channel, raw_stub
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

TOKEN = "interceptions-token-0123"
CREDENTIAL = (("authorization", f"Bearer {TOKEN}"),)
SERVICE = "/dsh.systemprompt.v1.SystemPromptService/"


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def guarded(tmp_path: Path, spans: InMemorySpanExporter) -> AsyncIterator[Sidecar]:
    """A sidecar with a credential and tracing: every interception there is."""
    (tmp_path / "token").write_text(TOKEN)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    config = parse_config({"auth_token_file": str(tmp_path / "token")})
    sidecar = await start_sidecar(config, "127.0.0.1:0", Tracing(provider))
    yield sidecar
    await sidecar.server.stop(grace=None)


def named(spans: InMemorySpanExporter, path: str) -> list[ReadableSpan]:
    return [span for span in spans.get_finished_spans() if span.name == path]


def status_code(span: ReadableSpan) -> object:
    return (span.attributes or {}).get("rpc.grpc.status_code")


async def test_every_call_is_traced_then_ended_identified_shared_authorized_then_parsed(
    guarded: Sidecar,
) -> None:
    assert [interception.name for interception in guarded.interceptions] == [
        "tracing",
        "status",
        "identity",
        "shares",
        "auth",
        "parsing",
    ]


async def test_without_tracing_or_credentials_only_status_shares_and_parsing_are_there(
    sidecar: Sidecar,
) -> None:
    names = [interception.name for interception in sidecar.interceptions]
    assert names == ["status", "shares", "parsing"]


async def test_a_call_refused_its_credential_is_traced_with_its_status(
    guarded: Sidecar, spans: InMemorySpanExporter
) -> None:
    async with raw_channel(guarded.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw_stub(channel).Dispose(pb.DisposeRequest(session_id="s"))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    [span] = named(spans, f"{SERVICE}Dispose")
    assert status_code(span) == grpc.StatusCode.UNAUTHENTICATED.value[0]


async def test_bytes_that_are_no_request_are_unauthenticated_before_they_are_parsed(
    guarded: Sidecar,
) -> None:
    async with raw_channel(guarded.address) as channel:
        call = channel.unary_unary(f"{SERVICE}Dispose", request_serializer=bytes)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(b"\xff\xff\xff", timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_watch_is_traced_as_one_span_for_its_life(
    guarded: Sidecar, spans: InMemorySpanExporter
) -> None:
    async with raw_channel(guarded.address) as channel:
        watch = raw_stub(channel).WatchChanges(pb.WatchChangesRequest(), metadata=CREDENTIAL)
        first = await watch.read()
        assert isinstance(first, pb.WatchChangesResponse)
        assert not named(spans, f"{SERVICE}WatchChanges")  # open: its span is not ended
        watch.cancel()
    await eventually(lambda: len(named(spans, f"{SERVICE}WatchChanges")) == 1, "the watch's span")


async def test_reflection_answers_a_caller_with_a_credential(guarded: Sidecar) -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    async with raw_channel(guarded.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = stub.ServerReflectionInfo(iter([request]), metadata=CREDENTIAL, timeout=5)
        answer = await answers.read()
    names = [service.name for service in answer.list_services_response.service]
    assert "dsh.systemprompt.v1.SystemPromptService" in names


async def test_reflection_refuses_a_caller_without_one(guarded: Sidecar) -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    async with raw_channel(guarded.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ServerReflectionInfo(iter([request]), timeout=5).read()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_health_is_answered_without_a_credential_and_traced(
    guarded: Sidecar, spans: InMemorySpanExporter
) -> None:
    async with raw_channel(guarded.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as unlisted:
            await health.List(health_pb2.HealthListRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert unlisted.value.code() == grpc.StatusCode.UNIMPLEMENTED  # as gRPC's servicer says
    [span] = named(spans, "/grpc.health.v1.Health/Check")
    assert status_code(span) == 0
