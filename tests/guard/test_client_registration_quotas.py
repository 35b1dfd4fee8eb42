"""Listeners and registered bytes per client (issue 22): one client holding every listener
(`limits.max_listeners_per_peer`) and every byte of registered values
(`limits.max_bytes_per_peer`) it may, however many sessions and connections it spreads them
over, does not stop another client installing and registering its own; what it held is
given back when the registration is disposed or its session ends, however it ends.

A client is what the sessions' quotas count by (test_client_quotas.py): the credential,
else the IP address, else the loopback connection; what a session registers counts against
the client that opened the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar, load_config
from dsh_system_prompt_server.registry import Kind
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import SidecarFactory, eventually, failure, rejection, section_names
from hostile.test_hostile_ejection import _listener, _outcome, _silent

from guard.test_client_quotas import TOKENS, credentials, kill, ready_process

LIMITS = {"max_listeners_per_peer": 2, "max_bytes_per_peer": 1000}
LISTENERS_REFUSED = (
    "{who} already has {held} listeners, the limit per client"
    " (limits.max_listeners_per_peer): dispose some"
)
BYTES_REFUSED = (
    "{who} already has {held} bytes of registered values, {adding} more would be over the"
    " limit per client of {limit} (limits.max_bytes_per_peer): dispose some"
)
HOG = 'credential "hog"'


def hog_and_agent(folder: Path) -> dict[str, Any]:
    """test_client_quotas' two credentials, `hog` and `agent`, also granted listeners on
    every assembly (a client's own, unscoped)."""
    config = credentials(folder)
    for entry in config["credentials"]:
        entry["global_listeners"] = True
    return config


async def passthrough(assembly: Any, context: Any, next_: Any) -> Any:
    return await next_()


async def marking(assembly: Any, context: Any, next_: Any) -> Any:
    """A listener whose work shows: it adds a section of its own."""
    handed = await next_()
    handed.sections.append(dsp.AssembledSection("marked", "by the agent's listener"))
    return handed


def assert_quota_exceeded(error: dsp.SystemPromptError, message: str) -> None:
    assert failure(error) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        dsp.Reason.QUOTA_EXCEEDED,
        message,
    )


def listeners_of(sidecar: Sidecar) -> int:
    return sum(entry.kind is Kind.LISTENER for entry in sidecar.registry.registrations())


def refused_listener(who: str, held: int = 2) -> str:
    return LISTENERS_REFUSED.format(who=who, held=held)


def refused_bytes(who: str, held: int, adding: int, limit: int = 1000) -> str:
    return BYTES_REFUSED.format(who=who, held=held, adding=adding, limit=limit)


async def agent_listens_and_registers(address: str, size: int, token: str | None = None) -> None:
    """Another client installs a listener that runs and registers `size` bytes."""
    async with dsp.connect(address, token=token) as agent:
        scope = await agent.scope("agent")
        await scope.on_assemble(marking)
        await scope.section("mine", 10, "a" * size)
        assembly = await agent.assemble(scope="agent", timeout=5)
        assert section_names(assembly)[-2:] == ["mine", "marked"]


# -- one client at its quota, another still served ---------------------------------------


Hogs = tuple[Sidecar, dsp.Client, dsp.Client]


@pytest.fixture(params=["unix", "tcp"])
async def hogs(
    request: pytest.FixtureRequest, make_sidecar: SidecarFactory, tmp_path: Path, unix_address: str
) -> AsyncIterator[Hogs]:
    """A sidecar with the quotas on a unix socket or loopback TCP, and two sessions of the
    credential `hog`, each on a connection of its own: one client."""
    listen = unix_address if request.param == "unix" else "127.0.0.1:0"
    sidecar = await make_sidecar(listen, limits=LIMITS, **hog_and_agent(tmp_path))
    token = TOKENS["hog"]
    async with (
        dsp.connect(sidecar.address, token=token) as first,
        dsp.connect(sidecar.address, token=token) as second,
    ):
        yield sidecar, first, second


async def test_a_credential_at_its_listener_quota_is_refused_while_another_installs_one(
    hogs: Hogs,
) -> None:
    sidecar, first, second = hogs
    await first.on_assemble(passthrough)
    await second.on_assemble(passthrough)  # another session and connection: one client
    revision = sidecar.registry.revision
    for hog in (first, second):
        assert_quota_exceeded(await rejection(hog.on_assemble(passthrough)), refused_listener(HOG))
    assert (sidecar.registry.revision, listeners_of(sidecar)) == (revision, 2)  # nothing left
    await agent_listens_and_registers(sidecar.address, 10, TOKENS["agent"])


async def test_a_credential_at_its_byte_quota_is_refused_while_another_registers(
    hogs: Hogs,
) -> None:
    sidecar, first, second = hogs
    one, two = await first.scope("hog-1"), await second.scope("hog-2")
    await one.section("text", 1, "t" * 600)
    variable = await two.variable("value", "v" * 300)
    await two.tools([dsp.ToolSchema.from_json("tool", "d" * 46, "{}")])  # 4 + 46 + 2 bytes
    revision = sidecar.registry.revision
    # 952 held, across two sessions: every kind of value that counts is refused past 1000.
    for refused in (
        one.context("more", 2, "c" * 49),
        two.variable("more", "m" * 49),
        one.tools([dsp.ToolSchema.from_json("more", "d" * 43, "{}")]),
    ):
        assert_quota_exceeded(await rejection(refused), refused_bytes(HOG, 952, 49))
    assert_quota_exceeded(  # an update that grows a value counts its growth
        await rejection(variable.update("v" * 349)), refused_bytes(HOG, 952, 49)
    )
    assert sidecar.registry.revision == revision  # nothing registered or changed
    await one.context("fits", 2, "c" * 48)  # exactly the limit
    await agent_listens_and_registers(sidecar.address, 1000, TOKENS["agent"])


async def test_a_loopback_connection_at_its_quotas_does_not_stop_another_connection(
    make_sidecar: SidecarFactory,
) -> None:
    # Over loopback without credentials each connection is a client (every local process
    # is 127.0.0.1), and each client of the Python package opens its own.
    sidecar = await make_sidecar(limits=LIMITS)
    async with dsp.connect(sidecar.address) as hog:
        scope = await hog.scope("hog")
        await scope.section("text", 1, "t" * 1000)
        for _ in range(2):
            await hog.on_assemble(passthrough)
        listener_error = await rejection(hog.on_assemble(passthrough))
        who = listener_error.message.split(" already has ")[0]
        assert who.startswith("the connection from 127.0.0.1:")
        assert_quota_exceeded(listener_error, refused_listener(who))
        bytes_error = await rejection(scope.variable("more", "m"))
        assert_quota_exceeded(bytes_error, refused_bytes(who, 1000, 1))
        await agent_listens_and_registers(sidecar.address, 1000)


async def test_on_a_unix_socket_without_credentials_a_session_at_its_quotas_does_not_stop_another(
    make_sidecar: SidecarFactory, unix_address: str
) -> None:
    # Nothing tells the clients of a unix socket apart (test_client_quotas.py): what a
    # session registers counts against the session itself, so none takes all of them.
    sidecar = await make_sidecar(unix_address, limits=LIMITS)
    async with dsp.connect(sidecar.address) as hog:
        scope = await hog.scope("hog")
        await scope.section("text", 1, "t" * 1000)
        for _ in range(2):
            await hog.on_assemble(passthrough)
        who = f"the session {hog.session_id}"
        assert_quota_exceeded(await rejection(hog.on_assemble(passthrough)), refused_listener(who))
        assert_quota_exceeded(
            await rejection(scope.variable("more", "m")), refused_bytes(who, 1000, 1)
        )
        await agent_listens_and_registers(sidecar.address, 1000)


# -- what a client held is given back ----------------------------------------------------


async def test_a_disposed_listener_or_value_gives_its_place_back(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(limits=LIMITS, **hog_and_agent(tmp_path))
    async with dsp.connect(sidecar.address, token=TOKENS["hog"]) as hog:
        listener = await hog.on_assemble(passthrough)
        await hog.on_assemble(passthrough)
        scope = await hog.scope("hog")
        section = await scope.section("text", 1, "t" * 600)
        variable = await scope.variable("value", "v" * 400)
        await listener()
        await hog.on_assemble(passthrough)  # the disposed listener's place
        assert_quota_exceeded(await rejection(hog.on_assemble(passthrough)), refused_listener(HOG))
        await section()
        await scope.context("more", 2, "c" * 600)  # the disposed section's bytes
        await variable.update("v" * 100)  # a value that shrinks gives back what it shrank by
        await scope.variable("rest", "r" * 300)
        assert_quota_exceeded(
            await rejection(scope.variable("over", "o")), refused_bytes(HOG, 1000, 1)
        )


async def test_a_closed_session_gives_its_listeners_and_bytes_back_to_its_client(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(limits=LIMITS, **hog_and_agent(tmp_path))
    token = TOKENS["hog"]
    async with dsp.connect(sidecar.address, token=token) as other:
        first = await dsp.connect(sidecar.address, token=token)
        await first.on_assemble(passthrough)
        await first.on_assemble(passthrough)
        await (await first.scope("hog-1")).section("text", 1, "t" * 1000)
        scope = await other.scope("hog-2")
        assert_quota_exceeded(
            await rejection(other.on_assemble(passthrough)), refused_listener(HOG)
        )
        assert_quota_exceeded(
            await rejection(scope.section("s", 1, "s")), refused_bytes(HOG, 1000, 1)
        )
        await first.close()
        await eventually(lambda: len(sidecar.state.sessions) == 1, "the closed session ends")
        await other.on_assemble(passthrough)
        await other.on_assemble(passthrough)
        await scope.section("text", 1, "t" * 1000)
        assert_quota_exceeded(
            await rejection(other.on_assemble(passthrough)), refused_listener(HOG)
        )


async def test_an_ejected_listener_gives_its_place_back(make_sidecar: SidecarFactory) -> None:
    # Raw streams: the Python client would install an ejected listener again.
    sidecar = await make_sidecar(limits=LIMITS, provider_timeout_s=0.5)
    async with _silent(sidecar) as (stub, _):  # one loopback connection: one client
        session_id = sidecar.state.sessions.all()[0].id
        await _listener(stub, session_id, "second")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _listener(stub, session_id, "third")
        message = refused.value.details() or ""
        who = message.split(" already has ")[0]
        assert (refused.value.code(), message) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            refused_listener(who),
        )
        assert await _outcome(stub) == "LISTENER_TIMEOUT"  # the first one, silent: ejected
        await eventually(lambda: listeners_of(sidecar) == 1, "the silent listener is ejected")
        await _listener(stub, session_id, "third")  # in the ejected one's place


_HOLDER = """
import asyncio, sys
import dsh_system_prompt as dsp

async def passthrough(assembly, context, next_):
    return await next_()

async def main() -> None:
    client = await dsp.connect(sys.argv[1], token=sys.argv[2])
    await (await client.scope("held")).section("held", 1, "h" * int(sys.argv[3]))
    for _ in range(int(sys.argv[4])):
        await client.on_assemble(passthrough)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def test_a_killed_clients_listeners_and_bytes_go_back_to_its_credentials_quota(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(limits=LIMITS, **hog_and_agent(tmp_path))
    limits = (str(LIMITS["max_bytes_per_peer"]), str(LIMITS["max_listeners_per_peer"]))
    async with (
        ready_process(_HOLDER, sidecar.address, TOKENS["hog"], *limits) as process,
        dsp.connect(sidecar.address, token=TOKENS["hog"]) as hog,
    ):
        scope = await hog.scope("hog")
        assert_quota_exceeded(await rejection(hog.on_assemble(passthrough)), refused_listener(HOG))
        assert_quota_exceeded(
            await rejection(scope.section("s", 1, "s")), refused_bytes(HOG, 1000, 1)
        )
        await kill(process)
        await eventually(
            lambda: len(sidecar.state.sessions) == 1, "the killed client's session ends", 10
        )
        await hog.on_assemble(passthrough)  # its whole quota is free again
        await hog.on_assemble(passthrough)
        await scope.section("text", 1, "t" * 1000)


# -- the keys ----------------------------------------------------------------------------


async def test_a_reload_changes_both_quotas_for_what_is_registered_next(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(limits=LIMITS)
    config = tmp_path / "sidecar.toml"
    config.write_text("[limits]\nmax_listeners_per_peer = 3\nmax_bytes_per_peer = 1500\n")
    async with dsp.connect(sidecar.address) as hog:
        for _ in range(2):
            await hog.on_assemble(passthrough)
        scope = await hog.scope("hog")
        await scope.section("text", 1, "t" * 1000)
        reloaded = Reloader(sidecar, str(config), lambda: load_config(config)).reload("a test")
        assert reloaded is not None
        assert set(reloaded.applied) == {
            "limits.max_listeners_per_peer",
            "limits.max_bytes_per_peer",
        }
        await hog.on_assemble(passthrough)
        await scope.variable("more", "m" * 500)
        error = await rejection(scope.variable("over", "o"))
        who = error.message.split(" already has ")[0]
        assert_quota_exceeded(error, refused_bytes(who, 1500, 1, limit=1500))
        assert_quota_exceeded(
            await rejection(hog.on_assemble(passthrough)), refused_listener(who, 3)
        )
