"""Every call is charged (issue 34, item 5): with credentials configured, a call that presents
none or a wrong one, and health's and reflection's, are charged to a share (over loopback,
the one share of every such call, `ANONYMOUS`) and wait their turn like any client's; a
refusal is counted and comes before anything the call sent is parsed. That a flood of them
leaves a credentialed client's p50 within 1.5x of calm is bench/figures/floods.py's figure;
here is the mechanism, on a real sidecar driven over real sockets.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.guard import ANONYMOUS
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import SidecarFactory, metric, raw_channel, raw_stub

from guard.test_fair_shares import LIGHT, TOKENS, credentials, light, sharing_sidecar

WRONG = (("authorization", "Bearer not-a-token-of-this-sidecar"),)
ASSEMBLE = "/dsh.systemprompt.v1.SystemPromptService/Assemble"
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
LIST_SERVICES = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}
REASON_TRAILER = "dsh-error-reason"


@pytest.fixture
async def sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    """A sidecar with fair shares' credentials (guard/test_fair_shares.py)."""
    return await make_sidecar(**credentials(tmp_path))


def _refused(sidecar: Any, reason: str) -> float:
    return metric(sidecar, "dsp_refused_calls_total", reason=reason)


def _reason(error: grpc.aio.AioRpcError) -> str:
    return dict(error.trailing_metadata() or ()).get(REASON_TRAILER, "")


@pytest.mark.parametrize("metadata", [None, WRONG], ids=["no token", "wrong token"])
async def test_a_call_without_a_valid_credential_is_refused_inside_the_anonymous_share(
    sidecar: Sidecar, metadata: Any
) -> None:
    shares = sidecar.state.shares
    assert shares.use(ANONYMOUS) == 0
    async with raw_channel(sidecar.address) as channel:
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw_stub(channel).Assemble(pb.AssembleRequest(), metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert _reason(refused.value) == "UNAUTHENTICATED"
    assert shares.use(ANONYMOUS) > 0  # charged: as a flood of them grows, they wait
    assert _refused(sidecar, "UNAUTHENTICATED") == 20


async def test_a_refusal_comes_before_the_calls_bytes_are_parsed(sidecar: Sidecar) -> None:
    """Bytes that are no AssembleRequest, without a token: UNAUTHENTICATED, not the
    INVALID_ARGUMENT a parse would give; a refusal costs less than the call it imitates."""
    async with raw_channel(sidecar.address) as channel:
        assemble = channel.unary_unary(ASSEMBLE)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await assemble(b"\xff\xff\xff\xff not a message", metadata=WRONG)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_health_is_charged_to_the_anonymous_share(sidecar: Sidecar) -> None:
    async with raw_channel(sidecar.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(20):
            reply = await health.Check(health_pb2.HealthCheckRequest())
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert sidecar.state.shares.use(ANONYMOUS) > 0


async def test_reflection_without_a_token_is_refused_and_charged_to_the_anonymous_share(
    sidecar: Sidecar,
) -> None:
    async with raw_channel(sidecar.address) as channel:
        reflection = channel.stream_stream(REFLECTION)
        for _ in range(5):
            call = reflection()
            await call.write(LIST_SERVICES)
            await call.done_writing()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert sidecar.state.shares.use(ANONYMOUS) > 0
    assert _refused(sidecar, "UNAUTHENTICATED") == 5


async def test_health_with_a_valid_token_is_charged_to_its_credential(sidecar: Sidecar) -> None:
    shares = sidecar.state.shares
    token = (("authorization", f"Bearer {TOKENS['light']}"),)
    async with raw_channel(sidecar.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(20):
            await health.Check(health_pb2.HealthCheckRequest(), metadata=token)
    assert shares.use(LIGHT) > 0
    assert shares.use(ANONYMOUS) == 0


async def test_a_denied_call_is_counted_and_charged_to_its_credential(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = credentials(tmp_path)
    config["credentials"][1] = {**config["credentials"][1], "role": "reader"}  # "light"
    config["credentials"][1].pop("global")
    config["credentials"][1].pop("scopes")
    sidecar = await make_sidecar(**config)
    token = (("authorization", f"Bearer {TOKENS['light']}"),)
    async with raw_channel(sidecar.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await raw_stub(channel).RegisterVariable(
                pb.RegisterVariableRequest(name="v", value="x"), metadata=token
            )
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert _refused(sidecar, "PERMISSION_DENIED") == 1
    assert sidecar.state.shares.use(LIGHT) > 0
    assert sidecar.state.shares.use(ANONYMOUS) == 0


async def flood(address: str, seconds: float) -> int:
    """Assembles with a wrong token, 16 at a time for `seconds`: how many were refused."""
    refused = 0
    until = time.monotonic() + seconds
    async with raw_channel(address) as channel:
        stub = raw_stub(channel)
        request = pb.AssembleRequest(context=pb.AssembleContext(scope="light"))

        async def lane() -> None:
            nonlocal refused
            while time.monotonic() < until:
                with pytest.raises(grpc.aio.AioRpcError):
                    await stub.Assemble(request, metadata=WRONG)
                refused += 1

        await asyncio.gather(*(lane() for _ in range(16)))
    return refused


async def test_a_flood_without_a_token_waits_for_its_share_and_a_credentialed_client_does_not(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sharing_sidecar(make_sidecar, tmp_path)
    refused, lit = await asyncio.gather(flood(sidecar.address, 2.0), light(sidecar.address, 2.0))
    shares = sidecar.state.shares
    assert _refused(sidecar, "UNAUTHENTICATED") == refused > 0
    assert (shares.waits_of(ANONYMOUS) > 0, shares.waits_of(LIGHT), lit > 0) == (True, 0, True)
    waits = sidecar.metrics.registry.get_sample_value("dsp_share_waits_total")
    assert waits >= shares.waits_of(ANONYMOUS)


@pytest.mark.parametrize("busy, waits", [(0.05, True), (0.0, False)], ids=["busy", "busy 0"])
async def test_a_flood_waits_once_the_loops_thread_is_busy_however_on_time_it_runs(
    make_sidecar: SidecarFactory, tmp_path: Path, busy: float, waits: bool
) -> None:
    # lateness never applies shares here (lag_s 0): a loop a flood keeps full on a host with
    # CPU to spare never sleeps, so its timers run on time; only the calls' use tells
    fair_share = {"lag_s": 0, "busy": busy, "floor": 0.0}
    sidecar = await make_sidecar(fair_share=fair_share, **credentials(tmp_path))
    shares = sidecar.state.shares
    refused, lit = await asyncio.gather(flood(sidecar.address, 1.5), light(sidecar.address, 1.5))
    assert lit > 0 and refused > 0
    assert (shares.waits_of(ANONYMOUS) > 0) is waits
    assert shares.waits_of(LIGHT) == 0
