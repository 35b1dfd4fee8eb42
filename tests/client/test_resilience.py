"""The sidecar as a neighbour in a pod: restarts, frozen and vanished peers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
from dsh_system_prompt_server.registry import Action, ChangeEvent
from helpers import SidecarFactory, eventually, rejection, section_names, tool
from processes import Served, free_port, serve

CALL_TIMEOUT_S = 30.0  # long beside failing fast, short beside a hung test
CLIENT_SCRIPT = """
import asyncio, sys
import dsh_system_prompt as dsp

async def main():
    client = await dsp.connect(sys.argv[1])
    await client.section("frozen", 50, "from the client process")
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def client_process(address: str) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT_SCRIPT, address, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        assert (await asyncio.wait_for(process.stdout.readline(), 15)).strip() == b"ready"
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.kill()
        await asyncio.wait_for(process.wait(), 5)


def config_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return str(path)


async def test_a_frozen_client_is_disposed_after_the_keepalive_bound_and_reconnects(
    tmp_path: Path,
) -> None:
    config = config_file(tmp_path, "dead_peer_timeout_s = 2.0\n")
    async with (
        serve("--listen", "127.0.0.1:0", "--config", config) as served,
        dsp.connect(served.address) as observer,
        client_process(served.address) as peer,
    ):

        async def has_frozen() -> bool:
            return "frozen" in section_names(await observer.assemble(timeout=5))

        async def lacks_frozen() -> bool:
            return not await has_frozen()

        assert await has_frozen()
        peer.send_signal(signal.SIGSTOP)
        await eventually(lacks_frozen, "the frozen client's section goes", timeout=15)
        peer.send_signal(signal.SIGCONT)
        await eventually(has_frozen, "the thawed client's section comes back", timeout=15)


async def test_clients_reconnect_and_replay_after_the_sidecar_restarts(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    config = config_file(
        tmp_path, 'persona = "Persona."\ntool_order = ["two-tool", "<unlisted-tools>"]\n'
    )
    async with serve("--listen", address, "--config", config) as first:
        one = await dsp.connect(address)
        two = await dsp.connect(address)
        try:
            await register_agent(one, "one", 10)
            await register_agent(two, "two", 20)
            before = {
                scope: await one.assemble(scope=scope, fields={"who": "w"}, timeout=5)
                for scope in (None, "agent-one", "agent-two")
            }
            keep_assembling = asyncio.create_task(assemble_forever(one, two))
            first.process.kill()
            await first.process.wait()
            async with serve("--listen", address, "--config", config):
                await eventually(
                    lambda: one.connected and two.connected, "both clients reconnect", timeout=20
                )
                after = {
                    scope: await one.assemble(scope=scope, fields={"who": "w"}, timeout=5)
                    for scope in before
                }
                keep_assembling.cancel()
                outcomes = await asyncio.gather(keep_assembling, return_exceptions=True)
                assert after == before
                assert not [o for o in outcomes if not isinstance(o, asyncio.CancelledError)]
        finally:
            await one.close()
            await two.close()


async def register_agent(client: dsp.Client, name: str, order: int) -> None:
    """Static and dynamic registrations, a scope with a parent, and a listener."""
    await client.section(f"{name}-static", order, f"{name} static")
    await client.section(f"{name}-dynamic", order + 1, lambda ctx: f"{name} for {ctx.get('who')}")
    await client.variable(f"{name}_var", name)
    await client.tools([tool(f"{name}-tool")])
    await client.context(f"{name}-context", order, "context")
    base = await client.scope(f"base-{name}")
    await base.section(f"{name}-base", order + 2, "inherited")
    agent = await client.scope(f"agent-{name}", parent=f"base-{name}")
    await agent.section("deployment:persona", 0, f"Persona of {name}.")

    async def tag(
        assembly: dsp.PromptAssembly,
        ctx: dsp.AssembleContext,
        next_: Callable[[], Awaitable[dsp.PromptAssembly]],
    ) -> dsp.PromptAssembly:
        assembly.variables[f"{name}_seen"] = "yes"
        return await next_()

    tag.__qualname__ = f"tag-{name}"
    await agent.on_assemble(tag)
    off = await client.section(f"{name}-gone", order + 3, "disposed before the restart")
    await off()


async def assemble_forever(*clients: dsp.Client) -> None:
    """Assemble in a loop, accepting only 'sidecar unavailable' while it is down."""
    while True:
        for client in clients:
            try:
                await client.assemble(timeout=2)
            except dsp.SystemPromptError as error:
                if error.code not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def served_and_client(**options: Any) -> AsyncIterator[tuple[str, Served, dsp.Client]]:
    """`serve` on a fixed address (to restart on) and a client of it (`options` to connect)."""
    address = f"127.0.0.1:{free_port()}"
    async with serve("--listen", address) as served:
        client = await dsp.connect(address, **options)
        try:
            yield address, served, client
        finally:
            await client.close()


async def kill(served: Served, client: dsp.Client) -> None:
    """Kill the sidecar's process; back once `client` sees it down."""
    served.process.kill()
    await served.process.wait()
    await eventually(lambda: not client.connected, "the client sees it down", timeout=10)


async def test_calls_while_the_sidecar_is_down_fail_fast_as_unavailable() -> None:
    async with served_and_client(call_timeout=CALL_TIMEOUT_S) as (_, served, client):
        await kill(served, client)
        # a client that waited for the sidecar would give up only at its call timeout
        error = await rejection(client.section("late", 1, "x"), within=CALL_TIMEOUT_S / 2)
        assert error.code == grpc.StatusCode.UNAVAILABLE
        assert "sidecar unavailable" in str(error)


async def test_an_assemble_with_a_deadline_waits_for_the_reconnect() -> None:
    async with served_and_client() as (address, served, client):
        await client.section("kept", 5, "kept across the restart")
        await kill(served, client)
        async with serve("--listen", address):
            assembly = await client.assemble(timeout=20)
        assert "kept" in section_names(assembly)


async def test_disposers_from_before_a_restart_still_work_after_it() -> None:
    async with served_and_client() as (address, served, client):
        off = await client.section("disposable", 5, "x")
        scope = await client.scope("agent")
        await scope.section("scoped", 5, "y")
        await kill(served, client)
        async with serve("--listen", address):
            await eventually(lambda: client.connected, "the client reconnects", timeout=20)
            assert "disposable" in section_names(await client.assemble(timeout=5))
            await off()
            await scope.dispose()
            assembly = await client.assemble(scope="agent", timeout=5)
        assert "disposable" not in section_names(assembly)
        assert "scoped" not in section_names(assembly)


async def test_a_disposer_called_during_the_replay_wins(make_sidecar: SidecarFactory) -> None:
    address = f"127.0.0.1:{free_port()}"
    before = await make_sidecar(listen=address)
    client = await dsp.connect(address)
    try:
        first = await client.section("first", 0, "made first, disposed mid-replay")
        for index in range(1, 1000):  # a replay long enough to dispose in the middle of
            await client.section(f"s{index}", index, "x")
        await before.server.stop(grace=None)
        await eventually(lambda: not client.connected, "the client sees it down", timeout=10)
        after = await make_sidecar(listen=address)

        def replayed_first() -> bool:
            return any(entry.name == "first" for entry in after.registry.registrations())

        await eventually(replayed_first, "the replay makes the first section", timeout=20)
        assert not client.connected  # still replaying the rest
        await first()
        await eventually(lambda: client.connected, "the replay ends", timeout=20)
        names = {entry.name for entry in after.registry.registrations()}
        assert "first" not in names and "s999" in names
    finally:
        await client.close()


async def test_a_replay_that_conflicts_retries_and_leaves_no_session_behind(
    make_sidecar: SidecarFactory,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    before = await make_sidecar(listen=address)
    client = await dsp.connect(address)
    try:
        await client.section("mine", 1, "first made by the client")
        await client.section("shared", 2, "the client's")
        await before.server.stop(grace=None)
        await eventually(lambda: not client.connected, "the client sees it down", timeout=10)
        after = await make_sidecar(listen=address)
        # Taken before any replay can run (no await in between): every replay conflicts.
        taken = after.registry.register_section("another-owner", None, "shared", 2, "theirs")
        changes = after.registry.changes.subscribe(capacity=10_000)
        attempts, sessions = 0, []
        while attempts < 3:  # each attempt makes "mine", then fails on "shared"
            event = await asyncio.wait_for(changes.next(), 20)
            made = isinstance(event, ChangeEvent) and event.action is Action.REGISTERED
            attempts += made and event.name == "mine"
            sessions.append(len(after.state.sessions))
        await eventually(lambda: len(after.state.sessions) == 0, "the failed attempt's end")
        assert not client.connected and max(sessions) <= 1
        after.registry.dispose("another-owner", taken.id)
        await eventually(lambda: client.connected, "the replay succeeds", timeout=20)
        names = [entry.name for entry in after.registry.registrations(client.session_id)]
        assert names == ["mine", "shared"]
        assert len(after.state.sessions) == 1
    finally:
        await client.close()
