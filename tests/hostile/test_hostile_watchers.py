"""Issue 22, finding 5: WatchPrompt streams of a large scope cost their streams, not a
prompt each, whether they read or stop reading."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar, load_config
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import SidecarFactory, eventually, traced_growth

BIG = "x" * (250 * 1024)
MIB = 1024 * 1024


async def _open_session(stub: pb_grpc.SystemPromptServiceStub) -> tuple[object, str]:
    stream = stub.OpenSession()
    await stream.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="watchers")))
    return stream, (await stream.read()).opened.session_id


async def _big_prompt_watchers(
    stub: pb_grpc.SystemPromptServiceStub, count: int
) -> tuple[object, str, list[Any]]:
    """A session with a 3 MiB prompt (more than a stream's window), `count` watchers of it
    that read their first message."""
    session, session_id = await _open_session(stub)
    for index in range(12):
        await stub.RegisterSection(
            pb.RegisterSectionRequest(session_id=session_id, name=f"big{index}", text=BIG)
        )
    watchers = [stub.WatchPrompt(pb.WatchPromptRequest()) for _ in range(count)]
    for watcher in watchers:
        await watcher.read()
    return session, session_id, watchers


def _cancel(*calls: Any) -> None:
    for call in calls:
        call.cancel()


async def test_prompt_watchers_keep_no_copy_of_the_last_prompt_they_were_sent(
    sidecar: Sidecar,
) -> None:
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session, session_id, watchers = await _big_prompt_watchers(stub, 16)

        async def change_and_read() -> None:
            await stub.RegisterSection(
                pb.RegisterSectionRequest(session_id=session_id, name="small", text="s")
            )
            for watcher in watchers:
                await watcher.read()  # the new prompt, read: the watchers are idle again

        held = await traced_growth(change_and_read)
        _cancel(session, *watchers)
    # the new prompt, shared by the sixteen (each one's copy was 3 MiB)
    assert held < 16 * MIB


async def test_prompt_watchers_that_stop_reading_hold_the_in_flight_bound_not_a_prompt_each(
    make_sidecar: SidecarFactory,
) -> None:
    # 4 x max_outbox_bytes (1 MiB here) for every watcher's message being written together
    sidecar = await make_sidecar(provider_timeout_s=30, limits={"max_outbox_bytes": 256 * 1024})
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session, session_id, watchers = await _big_prompt_watchers(stub, 16)

        async def change_unread() -> None:  # from here on the watchers read nothing
            for index in range(4):  # more prompts than the streams' windows take
                await stub.RegisterSection(
                    pb.RegisterSectionRequest(session_id=session_id, name=f"s{index}", text="s")
                )
                await asyncio.sleep(0.5)  # each watcher's next prompt is due

        held = await traced_growth(change_unread)
        _cancel(session, *watchers)
    # the new prompt, shared, and one watcher's message at a time: not sixteen of them
    assert held < 16 * MIB


OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # else channels share one connection
# and windows that do not grow as gRPC measures the link: a prompt unread stalls its stream
UNREAD = [*OWN_CONNECTION, ("grpc.http2.bdp_probe", 0)]


async def _latest(watcher: Any, revision: int) -> None:
    """Read `watcher` until its prompt is at `revision` or later."""
    while (await watcher.read()).revision < revision:
        pass


class _Scopes:
    """A session's two scopes: "big" with a 3 MiB prompt (more than a stream's window),
    "small" with next to nothing."""

    def __init__(self, stub: pb_grpc.SystemPromptServiceStub) -> None:
        self._stub = stub
        self.ids: dict[str, str] = {}
        self._changes = 0

    async def open(self) -> object:
        session, self._session_id = await _open_session(self._stub)
        for key in ("big", "small"):
            opened = await self._stub.OpenScope(
                pb.OpenScopeRequest(session_id=self._session_id, key=key)
            )
            self.ids[key] = opened.scope_id
        for index in range(12):
            await self._register("big", f"b{index}", BIG)
        return session

    async def change(self) -> dict[str, int]:
        """A change in each scope; the revision of each."""
        self._changes += 1
        return {key: await self._register(key, f"c{self._changes}", "c") for key in self.ids}

    async def _register(self, key: str, name: str, text: str) -> int:
        request = pb.RegisterSectionRequest(
            session_id=self._session_id, scope_id=self.ids[key], name=name, text=text
        )
        return int((await self._stub.RegisterSection(request)).revision)


def _watch(channel: grpc.aio.Channel, scope: str) -> Any:
    return pb_grpc.SystemPromptServiceStub(channel).WatchPrompt(pb.WatchPromptRequest(scope=scope))


async def test_one_clients_stalled_prompt_watchers_cost_only_its_share_of_the_prompts_in_flight(
    make_sidecar: SidecarFactory,
) -> None:
    # 4 x max_outbox_bytes (1 MiB) in flight, max_outbox_bytes (256 KiB) a client: its 3 MiB
    # prompt goes alone and counts as one share; a stall lasts the write timeout, 60 s
    sidecar = await make_sidecar(provider_timeout_s=60, limits={"max_outbox_bytes": 256 * 1024})
    in_flight = sidecar.state.watches.prompts_in_flight
    async with (
        grpc.aio.insecure_channel(sidecar.address) as owner,
        grpc.aio.insecure_channel(sidecar.address, options=UNREAD) as hog,
        grpc.aio.insecure_channel(sidecar.address, options=OWN_CONNECTION) as other,
    ):
        scopes = _Scopes(pb_grpc.SystemPromptServiceStub(owner))
        session = await scopes.open()
        hogs = [_watch(hog, "big") for _ in range(8)]
        await asyncio.gather(*(watcher.read() for watcher in hogs))  # and never again
        same, small = _watch(other, "big"), _watch(other, "small")
        await asyncio.gather(same.read(), small.read())
        for _ in range(3):
            revisions = await scopes.change()
            # within a third of the write timeout: nobody waits for the hog's stalls to end
            await asyncio.wait_for(
                asyncio.gather(_latest(same, revisions["big"]), _latest(small, revisions["small"])),
                20,
            )
            # the hog holds its share: a prompt of it being written, the others waiting
            assert in_flight.bytes > 0 and in_flight.waiting() > 0
        assert not any(watcher.done() for watcher in hogs)
        _cancel(session, same, small, *hogs)


async def test_a_reload_raising_max_outbox_bytes_lets_the_prompts_waiting_on_it_go(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("provider_timeout_s = 60\n[limits]\nmax_outbox_bytes = 262144\n")
    sidecar = await make_sidecar(provider_timeout_s=60, limits={"max_outbox_bytes": 256 * 1024})
    reloader = Reloader(sidecar, str(config), lambda: load_config(config))
    in_flight = sidecar.state.watches.prompts_in_flight
    async with (
        grpc.aio.insecure_channel(sidecar.address) as owner,
        grpc.aio.insecure_channel(sidecar.address, options=UNREAD) as client,
    ):
        scopes = _Scopes(pb_grpc.SystemPromptServiceStub(owner))
        session = await scopes.open()
        stalled, small = _watch(client, "big"), _watch(client, "small")
        await asyncio.gather(stalled.read(), small.read())  # then the big one is never read
        revisions = await scopes.change()
        # its 3 MiB prompt stalled fills the client's share: the small prompt waits on it
        await eventually(lambda: in_flight.waiting() == 1, "the small prompt waiting")
        config.write_text("provider_timeout_s = 60\n[limits]\nmax_outbox_bytes = 4194304\n")
        reloaded = reloader.reload("SIGHUP")
        assert reloaded is not None and reloaded.applied == ["limits.max_outbox_bytes"]
        # room for both now: it goes at once, not when the stalled write times out (60 s)
        await asyncio.wait_for(_latest(small, revisions["small"]), 20)
        assert in_flight.max_bytes == 4 * 4194304 and not stalled.done()
        _cancel(session, stalled, small)
