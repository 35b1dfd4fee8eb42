"""Shared fixtures: a real sidecar on an ephemeral loopback port, and clients of it.

The suite uses plain pytest-asyncio fixtures rather than pytest-grpc(-aio): those
plugins build a bare server around one servicer, while these tests must drive
the sidecar exactly as `serve` builds it (health, reflection, drain, config).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server.app import Sidecar, start_sidecar
from dsh_system_prompt_server.config import parse_config
from helpers import ClientFactory, SidecarFactory


@pytest.fixture
async def make_sidecar() -> AsyncIterator[SidecarFactory]:
    """Start sidecars with config keys as keyword arguments (TOML names)."""
    started: list[Sidecar] = []

    async def make(listen: str = "127.0.0.1:0", **config: Any) -> Sidecar:
        sidecar = await start_sidecar(parse_config(config), listen)
        started.append(sidecar)
        return sidecar

    yield make
    for sidecar in started:
        await sidecar.server.stop(grace=None)


@pytest.fixture
async def sidecar(make_sidecar: SidecarFactory) -> Sidecar:
    """A sidecar with the spec's default config."""
    return await make_sidecar()


@pytest.fixture
async def connect(sidecar: Sidecar) -> AsyncIterator[ClientFactory]:
    """Open more clients (sessions) on the default sidecar; all closed at the end."""
    clients: list[dsp.Client] = []

    async def open_client(address: str | None = None) -> dsp.Client:
        client = await dsp.connect(address or sidecar.address)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()


@pytest.fixture
async def client(connect: ClientFactory) -> dsp.Client:
    """One client session on the default sidecar."""
    return await connect()
