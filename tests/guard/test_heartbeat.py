"""The fair shares' heartbeat (the loop's lateness, measured every `beat_s`) ticks only while
calls are in flight: an idle sidecar wakes for nothing. Counted by the shares' own count of
beats, on a real sidecar driven by real clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dsh_system_prompt as dsp
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import SidecarFactory

from guard.test_fair_shares import FIELDS_PAD, credentials, light

BEAT_S = 0.025  # ShareSettings.beat_s


async def test_the_heartbeat_ticks_under_load_and_not_while_idle(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(**credentials(tmp_path))  # its clients' calls are charged
    shares = sidecar.state.shares
    assert shares.running
    await asyncio.sleep(20 * BEAT_S)
    assert shares.beats == 0  # serving, nothing in flight: not one beat

    assert await light(sidecar.address, 0.5) > 0
    under_load = shares.beats
    assert under_load > 0  # it ticked with the calls

    await asyncio.sleep(4 * BEAT_S)  # the beat after the last call finds nothing: it stops
    stopped = shares.beats
    await asyncio.sleep(20 * BEAT_S)
    assert shares.beats == stopped  # idle again: no wake-up at all

    assert await light(sidecar.address, 0.3) > 0
    assert shares.beats > stopped  # load again: it ticks again


async def test_calls_of_clients_nobody_holds_start_no_heartbeat(
    make_sidecar: SidecarFactory,
) -> None:
    """Over loopback without credentials nobody is held (nothing is charged to anyone), so
    nothing is measured for it either, whatever the load."""
    sidecar = await make_sidecar()
    async with dsp.connect(sidecar.address) as client:
        for _ in range(50):
            await client.assemble(fields={"pad": "p" * FIELDS_PAD})
    assert sidecar.state.shares.beats == 0


async def test_health_checks_over_loopback_without_credentials_start_no_heartbeat(
    make_sidecar: SidecarFactory,
) -> None:
    """Health is charged like every call, but without credentials a loopback probe is nobody's
    to hold: an idle sidecar's probes wake no heartbeat (the tax's idle_cpu)."""
    sidecar = await make_sidecar()
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(50):
            await health.Check(health_pb2.HealthCheckRequest())
    assert sidecar.state.shares.beats == 0
