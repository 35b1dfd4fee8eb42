"""Shared fixtures: a real sidecar on an ephemeral loopback port, and clients of it.

The real sidecar is started with plain pytest-asyncio fixtures rather than
pytest-grpc: that plugin builds a bare server around one servicer, while these
tests must drive the sidecar exactly as `serve` builds it (health, reflection,
drain, config). pytest-grpc serves the scripted sidecars (`scripted`), which
are exactly such a bare server.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from deploy_files import read_line, start, stop
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar, parse_config, start_sidecar
from helpers import ClientFactory, ClientOf, SidecarFactory, raw_channel, raw_stub
from processes import sidecar_command
from scripted import LoopWatch, Script, ScriptedSidecar, left_behind


@pytest.fixture
def unix_address() -> Iterator[str]:
    """A unix socket path short enough for sun_path (pytest's tmp_path may not be)."""
    directory = tempfile.mkdtemp(prefix="dsp-", dir="/tmp")
    yield f"unix:{directory}/sidecar.sock"
    shutil.rmtree(directory, ignore_errors=True)


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
        await sidecar.close_admin()


@pytest.fixture
def client_of(make_sidecar: SidecarFactory) -> ClientOf:
    """`async with client_of(**config) as client`: a client of a new sidecar with those
    config keys (TOML names)."""

    @contextlib.asynccontextmanager
    async def open_client(**config: Any) -> AsyncIterator[dsp.Client]:
        sidecar = await make_sidecar(**config)
        async with dsp.connect(sidecar.address) as client:
            yield client

    return open_client


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


@pytest.fixture
async def stub(sidecar: Sidecar) -> AsyncIterator[pb_grpc.SystemPromptServiceStub]:
    """The wire contract itself on the default sidecar, as a client in another language
    would call it."""
    async with raw_channel(sidecar.address) as channel:
        yield raw_stub(channel)


# -- scripted sidecars (pytest-grpc serves one per test module; tests/scripted.py) -----


@pytest.fixture(scope="module")
def grpc_add_to_server() -> Callable[[ScriptedSidecar, grpc.Server], None]:
    return pb_grpc.add_SystemPromptServiceServicer_to_server  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def grpc_servicer() -> ScriptedSidecar:
    return ScriptedSidecar()


@pytest.fixture
async def scripted(
    grpc_server: grpc.Server, grpc_servicer: ScriptedSidecar, grpc_addr: str
) -> AsyncIterator[ScriptedSidecar]:
    """The module's scripted sidecar with a fresh `Script`. After the test, the client
    must have left nothing: no stream open on the sidecar, no task in the loop, and
    the loop never stalled."""
    grpc_servicer.script = Script()
    grpc_servicer.address = grpc_addr
    before = asyncio.all_tasks()
    watch = LoopWatch()
    yield grpc_servicer
    await watch.stop()
    assert not await left_behind(before), "the client left tasks running"
    closed = await asyncio.to_thread(grpc_servicer.wait_all_closed, 5.0)
    assert closed, f"{grpc_servicer.open_streams} streams still open on the sidecar"
    assert watch.longest < _LONGEST_STALL_S, f"the event loop stalled {watch.longest:.2f}s"


_LONGEST_STALL_S = 1.0  # generous for a loaded 2-core machine; a blocked loop stalls for good


@pytest.fixture
def sidecar_on() -> Iterator[Any]:
    """Start the installed `serve` on an address; stopped after the test."""
    running: list[subprocess.Popen[str]] = []

    def serve_on(listen: str) -> str:
        process = start([sidecar_command(), "serve", "--listen", listen], {})
        running.append(process)
        line = read_line(process)
        assert "listening on" in line, line
        return line.split("listening on", 1)[1].strip()

    yield serve_on
    for process in running:
        stop(process)
