"""Issue 22, finding 6: idle connections do not lock out new agents."""

from __future__ import annotations

import asyncio
import resource
import socket
import sys
from collections.abc import AsyncIterator, Iterator

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory

# Opens COUNT TCP connections to HOST:PORT, says so, and holds them without a byte sent.
_IDLE = """
import socket, sys, time
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = [socket.create_connection((host, port)) for _ in range(count)]
print("open", flush=True)
time.sleep(120)
"""


@pytest.fixture
def low_open_files() -> Iterator[None]:
    """The common default soft limit of open files, 1024, for the test's sidecar."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"the hard limit of open files ({hard}) leaves no room to test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _idle_connections(sidecar: Sidecar, count: int) -> AsyncIterator[None]:
    host, _, port = sidecar.address.rpartition(":")
    idle = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _IDLE, host, port, str(count), stdout=asyncio.subprocess.PIPE
    )
    assert idle.stdout is not None
    try:
        assert await asyncio.wait_for(idle.stdout.readline(), 60) == b"open\n"
        yield
    finally:
        idle.kill()
        await idle.wait()


async def test_the_sidecar_raises_its_open_file_soft_limit_to_the_hard_limit(
    low_open_files: None, make_sidecar: SidecarFactory
) -> None:
    await make_sidecar()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard


async def test_a_new_agent_connects_while_1100_idle_connections_are_open(
    low_open_files: None, make_sidecar: SidecarFactory
) -> None:
    sidecar = await make_sidecar(handshake_timeout_s=120)  # the idle ones stay throughout
    async for _ in _idle_connections(sidecar, 1100):
        client = await dsp.connect(sidecar.address, client_name="newcomer")
        try:
            await client.section("hello", 1, "hello")
            assembly = await client.assemble(timeout=10)
        finally:
            await client.close()
        assert assembly.sections[-1].text == "hello"


def _closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the sidecar closes `sock` (reading past its SETTINGS frame) in `timeout`."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


async def test_a_connection_that_sends_no_http2_preface_is_closed_after_the_handshake_timeout(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(handshake_timeout_s=0.5)
    host, _, port = sidecar.address.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        assert await asyncio.to_thread(_closed_by_peer, sock, 30)


async def test_connections_past_max_connections_are_closed_at_once(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_connections": 4}, handshake_timeout_s=120)
    host, _, port = sidecar.address.rpartition(":")
    held = [socket.create_connection((host, int(port))) for _ in range(4)]
    try:
        with socket.create_connection((host, int(port))) as fifth:
            assert await asyncio.to_thread(_closed_by_peer, fifth, 30)
    finally:
        for sock in held:
            sock.close()
