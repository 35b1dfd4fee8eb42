"""Quotas per client, not per connection (issue 22, finding 7): one client holding every
session and watch it may does not stop another from opening its own, and what a client
held is given back however its streams end.

A client is what the sidecar can tell apart: the credential a call presents, else the
peer's IP address over TCP (a loopback connection on its own), else nobody (a unix
socket without credentials: only the sidecar-wide limits apply).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt.errors import error_from_rpc
from helpers import SidecarFactory, eventually, failure, section_names

TOKENS = {"hog": "hog-token-0123456789", "agent": "agent-token-0123456789"}
QUOTAS = {"max_sessions": 20, "max_sessions_per_peer": 3, "max_watchers_per_peer": 2}
SESSIONS_REFUSED = (
    "{who} already has 3 sessions, the limit per client (limits.max_sessions_per_peer): close some"
)
WATCHES_REFUSED = (
    "{who} already has 2 watches, the limit per client (limits.max_watchers_per_peer): close some"
)


def credentials(folder: Path) -> dict[str, Any]:
    """Config keys: two agent credentials, `hog` and `agent`, that may watch every scope."""
    entries = []
    for name, token in TOKENS.items():
        path = folder / f"{name}.token"
        path.write_text(token + "\n")
        entries.append({"name": name, "role": "agent", "scopes": ["*"], "token_file": str(path)})
    return {"credentials": entries}


class Hog:
    """One process opening sessions and watches, each on a connection of its own (so that
    counting per connection would admit every one), or all on one."""

    def __init__(self, address: str, token: str | None = None, connections: bool = True) -> None:
        self.address = address
        self.metadata = () if token is None else (("authorization", f"Bearer {token}"),)
        self.connections = connections
        self.channels: list[grpc.aio.Channel] = []
        self.calls: list[Any] = []

    def _stub(self) -> pb_grpc.SystemPromptServiceStub:
        if self.connections or not self.channels:
            options = [("grpc.use_local_subchannel_pool", 1)]
            self.channels.append(grpc.aio.insecure_channel(self.address, options=options))
        return pb_grpc.SystemPromptServiceStub(self.channels[-1])

    async def session(self) -> Any:
        """Open one session; raises AioRpcError if refused."""
        call = self._stub().OpenSession(metadata=self.metadata)
        self.calls.append(call)
        await call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="hog")))
        assert (await call.read()).HasField("opened")
        return call

    async def watch(self) -> Any:
        """Open one change watch; raises AioRpcError if refused."""
        call = self._stub().WatchChanges(pb.WatchChangesRequest(), metadata=self.metadata)
        self.calls.append(call)
        await call.read()
        return call

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            await channel.close()


@contextlib.asynccontextmanager
async def hog_of(
    address: str, token: str | None = None, connections: bool = True
) -> AsyncIterator[Hog]:
    hog = Hog(address, token, connections)
    try:
        yield hog
    finally:
        await hog.close()


async def refusal(opening: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await opening
    return refused.value


def assert_quota_exceeded(error: grpc.aio.AioRpcError, message: str) -> None:
    assert failure(error_from_rpc(error)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        dsp.Reason.QUOTA_EXCEEDED,
        message,
    )


async def fill_quota(hog: Hog) -> None:
    """The hog takes every session and watch its quota allows, one connection each."""
    for _ in range(QUOTAS["max_sessions_per_peer"]):
        await hog.session()
    for _ in range(QUOTAS["max_watchers_per_peer"]):
        await hog.watch()


async def agent_works(address: str, token: str | None = None) -> None:
    """A new agent opens its session and a watch, and assembles."""
    async with dsp.connect(address, token=token) as agent:
        watch = await agent.watch_changes()
        scope = await agent.scope("new-agent")
        await scope.section("mine", 10, "the new agent's")
        assert "mine" in section_names(await agent.assemble(scope="new-agent", timeout=5))
        await watch.close()


# -- one client at its quota, another still served ---------------------------------------


@pytest.mark.parametrize("transport", ["unix", "tcp"])
async def test_a_credential_at_its_quota_does_not_stop_another_credential_opening_its_own(
    make_sidecar: SidecarFactory, tmp_path: Path, unix_address: str, transport: str
) -> None:
    listen = unix_address if transport == "unix" else "127.0.0.1:0"
    sidecar = await make_sidecar(listen, limits=QUOTAS, **credentials(tmp_path))
    async with hog_of(sidecar.address, TOKENS["hog"]) as hog:
        await fill_quota(hog)
        # A connection more is still the same credential: refused, in the quota's words.
        assert_quota_exceeded(
            await refusal(hog.session()), SESSIONS_REFUSED.format(who='credential "hog"')
        )
        assert_quota_exceeded(
            await refusal(hog.watch()), WATCHES_REFUSED.format(who='credential "hog"')
        )
        await agent_works(sidecar.address, TOKENS["agent"])


def non_loopback_address(family: socket.AddressFamily) -> str | None:
    """An address of this host in `family` that is not loopback (the one its default route
    leaves from), or None; connecting to it from here, the peer is that address."""
    probe_address = "192.0.2.1" if family == socket.AF_INET else "2001:db8::1"
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((probe_address, 9))  # a UDP connect sends nothing
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(address).is_loopback else address


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6"])
async def test_connections_from_one_address_share_its_quota_and_a_loopback_agent_is_served(
    make_sidecar: SidecarFactory, family: socket.AddressFamily
) -> None:
    remote = non_loopback_address(family)
    if remote is None:
        pytest.skip(f"this host has no non-loopback {family.name} address to connect from")
    sidecar = await make_sidecar("[::]:0", limits=QUOTAS)  # both families
    port = sidecar.address.rpartition(":")[2]
    host = remote if family == socket.AF_INET else f"[{remote}]"
    async with hog_of(f"{host}:{port}") as hog:
        await fill_quota(hog)
        assert_quota_exceeded(
            await refusal(hog.session()), SESSIONS_REFUSED.format(who=f"the address {remote}")
        )
        assert_quota_exceeded(
            await refusal(hog.watch()), WATCHES_REFUSED.format(who=f"the address {remote}")
        )
        await agent_works(f"127.0.0.1:{port}")


@pytest.mark.parametrize(
    ("listen", "connect", "seen"),
    [
        ("127.0.0.1:0", "127.0.0.1", "127.0.0.1"),
        ("[::1]:0", "[::1]", "[::1]"),
        ("[::]:0", "127.0.0.1", "127.0.0.1"),  # dual stack
    ],
)
async def test_a_loopback_connection_at_its_quota_does_not_stop_another_connection(
    make_sidecar: SidecarFactory, listen: str, connect: str, seen: str
) -> None:
    # Every local process is 127.0.0.1: counting per address would make every local agent
    # one client, so that one at its quota locks out the rest.
    sidecar = await make_sidecar(listen, limits=QUOTAS)
    address = f"{connect}:{sidecar.address.rpartition(':')[2]}"
    async with hog_of(address, connections=False) as hog:
        await fill_quota(hog)
        for opening in (hog.session(), hog.watch()):
            error = await refusal(opening)
            who = (error.details() or "").split(" already has ")[0]  # the connection's port
            assert who.startswith(f"the connection from {seen}:")
        assert_quota_exceeded(error, WATCHES_REFUSED.format(who=who))
        await agent_works(address)


async def test_on_a_unix_socket_without_credentials_only_the_sidecar_limits_apply(
    make_sidecar: SidecarFactory, unix_address: str
) -> None:
    # gRPC names every peer of a unix socket `unix:` and grpcio shows no SO_PEERCRED: the
    # sidecar cannot tell its clients apart, so none is refused for what another holds.
    limits = {"max_sessions": 4, "max_sessions_per_peer": 1, "max_watchers_per_peer": 1}
    sidecar = await make_sidecar(unix_address, limits=limits)
    async with hog_of(sidecar.address) as hog:
        for _ in range(3):
            await hog.session()
            await hog.watch()
        await agent_works(sidecar.address)  # the fourth session, two watches more
        await hog.session()
        error = await refusal(hog.session())
        assert (error.code(), error.details()) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "the sidecar already has 4 sessions, its limit",
        )


# -- what a client held is given back ----------------------------------------------------


async def test_a_closed_session_and_a_cancelled_watch_give_their_places_back(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(limits=QUOTAS, **credentials(tmp_path))
    async with hog_of(sidecar.address, TOKENS["hog"]) as hog:
        await fill_quota(hog)
        session, watch = hog.calls[0], hog.calls[-1]
        await session.done_writing()  # the client closes its session
        assert await session.read() is grpc.aio.EOF
        watch.cancel()
        await eventually(lambda: len(sidecar.state.sessions) == 2, "the closed session ends")
        await eventually(
            lambda: sidecar.registry.changes.subscriber_count() == 1, "the cancelled watch ends"
        )
        await hog.session()
        await hog.watch()
        assert_quota_exceeded(
            await refusal(hog.session()), SESSIONS_REFUSED.format(who='credential "hog"')
        )


_HOG = """
import asyncio, sys
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

async def main() -> None:
    metadata = (("authorization", "Bearer " + sys.argv[2]),)
    held = []
    for _ in range(int(sys.argv[3])):
        options = [("grpc.use_local_subchannel_pool", 1)]  # a connection each
        channel = grpc.aio.insecure_channel(sys.argv[1], options=options)
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session = stub.OpenSession(metadata=metadata)
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="hog")))
        assert (await session.read()).HasField("opened")
        watch = stub.WatchChanges(pb.WatchChangesRequest(), metadata=metadata)
        await watch.read()
        held += [channel, session, watch]
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def ready_process(script: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """A Python process running `script` with `args`, once it has printed "ready" (it
    holds what it was told to); killed at the end if it is still running."""
    command = (sys.executable, "-c", script, *args)
    pipe = asyncio.subprocess.PIPE
    process = await asyncio.create_subprocess_exec(*command, stdout=pipe, stderr=pipe)
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 20)
        assert line.strip() == b"ready", (await process.communicate())[1].decode()[-2000:]
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await asyncio.wait_for(process.wait(), 5)


async def kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL: the process says nothing more, its connections are closed by the kernel."""
    process.send_signal(signal.SIGKILL)
    await asyncio.wait_for(process.wait(), 5)


async def test_a_killed_clients_sessions_and_watches_go_back_to_its_credentials_quota(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    quotas = {**QUOTAS, "max_watchers_per_peer": QUOTAS["max_sessions_per_peer"]}
    sidecar = await make_sidecar(limits=quotas, **credentials(tmp_path))
    held = str(QUOTAS["max_sessions_per_peer"])
    async with (
        ready_process(_HOG, sidecar.address, TOKENS["hog"], held) as process,
        hog_of(sidecar.address, TOKENS["hog"]) as hog,
    ):
        assert_quota_exceeded(
            await refusal(hog.session()), SESSIONS_REFUSED.format(who='credential "hog"')
        )
        await kill(process)
        await eventually(
            lambda: len(sidecar.state.sessions) == 0, "the killed client's sessions end", 10
        )
        await eventually(
            lambda: sidecar.registry.changes.subscriber_count() == 0,
            "the killed client's watches end",
            10,
        )
        for _ in range(QUOTAS["max_sessions_per_peer"]):  # its whole quota is free again
            await hog.session()
            await hog.watch()
