"""Operability: metrics, structured logs, reflection switch, health."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import ClientOf, SidecarFactory
from processes import free_port, serve
from prometheus_client import generate_latest


async def scrape(address: str) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            return str(response.read().decode())

    return await asyncio.to_thread(get)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


async def test_metrics_report_sessions_registrations_latency_and_failures(
    client_of: ClientOf,
) -> None:
    metrics_address = f"127.0.0.1:{free_port()}"
    async with client_of(metrics_listen=metrics_address) as client:
        await client.section("a", 1, "x")
        await client.section("broken", 2, lambda ctx: 1 / 0)
        with pytest.raises(dsp.SystemPromptError):
            await client.assemble()
        text = await scrape(metrics_address)
    assert metric(text, "dsp_sessions") == 1
    assert metric(text, "dsp_registrations") == 4  # two built-ins and two sections
    assert metric(text, "dsp_assemble_seconds_count") == 1
    assert 'dsp_assembly_failures_total{reason="PROVIDER_FAILED"} 1.0' in text


async def test_every_assemble_a_kept_answer_too_lands_in_the_latency_histogram(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar()
    async with dsp.connect(sidecar.address) as client:
        await client.section("a", 1, "x")
        for _ in range(3):  # the second and third answered from the kept response
            await client.assemble()
    text = generate_latest(sidecar.metrics.registry).decode()  # what /metrics serves
    buckets = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dsp_assemble_seconds_bucket{")
    ]
    assert "# TYPE dsp_assemble_seconds histogram" in text
    assert 'dsp_assemble_seconds_bucket{le="+Inf"} 3.0' in text
    assert buckets == sorted(buckets) and len(buckets) == 12
    assert metric(text, "dsp_assemble_seconds_count") == 3
    assert 0 < metric(text, "dsp_assemble_seconds_sum") < 5


async def test_json_logs_are_one_object_per_line() -> None:
    async with serve("--listen", "127.0.0.1:0", "--log-format", "json") as served:
        async with dsp.connect(served.address) as client:
            await client.assemble()
        served.process.terminate()
        assert await asyncio.wait_for(served.process.wait(), 10) == 0
        lines = [line for line in served.logs().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records, "no JSON log lines"
    assert {"time", "level", "logger", "message"} <= set(records[0])
    assert any("serving on" in record["message"] for record in records)


async def list_services(address: str) -> list[str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = stub.ServerReflectionInfo(iter([request]))
        async for response in responses:
            return [s.name for s in response.list_services_response.service]
    return []


async def test_reflection_can_be_switched_off(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar(reflection=False)
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await list_services(sidecar.address)
    assert failure.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_reflection_is_on_by_default_on_loopback(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar()
    assert "dsh.systemprompt.v1.SystemPromptService" in await list_services(sidecar.address)


async def test_metrics_do_not_list_scope_keys_by_default(client_of: ClientOf) -> None:
    metrics_address = f"127.0.0.1:{free_port()}"
    async with client_of(metrics_listen=metrics_address) as client:
        for _ in range(2):
            await client.assemble(scope="secret-customer-agent", report=True)
        text = await scrape(metrics_address)
    assert "secret-customer-agent" not in text
    assert metric(text, "dsp_prefix_stable_ratio") == 1.0


async def test_metrics_label_scopes_when_asked_to(client_of: ClientOf) -> None:
    metrics_address = f"127.0.0.1:{free_port()}"
    async with client_of(metrics_listen=metrics_address, metrics_key_labels=True) as client:
        for _ in range(2):
            await client.assemble(scope="agent-1", report=True)
        text = await scrape(metrics_address)
    assert 'dsp_prefix_stable_ratio{scope="agent-1"} 1.0' in text
