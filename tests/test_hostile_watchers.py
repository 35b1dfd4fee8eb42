"""Issue 22, finding 5: WatchPrompt streams of a large scope cost their streams, not a
prompt each, whether they read or stop reading."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, traced_growth

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
        stub = pb_grpc.SystemPromptServiceStub(owner)
        session, session_id = await _open_session(stub)
        scopes = {}
        for key in ("big", "small"):
            opened = await stub.OpenScope(pb.OpenScopeRequest(session_id=session_id, key=key))
            scopes[key] = opened.scope_id
        for index in range(12):  # a 3 MiB prompt, more than a stream's window
            await stub.RegisterSection(
                pb.RegisterSectionRequest(
                    session_id=session_id, scope_id=scopes["big"], name=f"b{index}", text=BIG
                )
            )
        hogs = [
            pb_grpc.SystemPromptServiceStub(hog).WatchPrompt(pb.WatchPromptRequest(scope="big"))
            for _ in range(8)
        ]
        await asyncio.gather(*(watcher.read() for watcher in hogs))  # and never again
        theirs = pb_grpc.SystemPromptServiceStub(other)
        same, small = (theirs.WatchPrompt(pb.WatchPromptRequest(scope=s)) for s in scopes)
        await same.read()
        await small.read()

        async def change_and_read(index: int) -> None:
            revisions = {}
            for key in scopes:
                changed = await stub.RegisterSection(
                    pb.RegisterSectionRequest(
                        session_id=session_id, scope_id=scopes[key], name=f"c{index}", text="c"
                    )
                )
                revisions[key] = changed.revision
            # within a third of the write timeout: nobody waits for the hog's stalls to end
            await asyncio.wait_for(
                asyncio.gather(_latest(same, revisions["big"]), _latest(small, revisions["small"])),
                20,
            )

        for index in range(3):
            await change_and_read(index)
            # the hog holds its share: a prompt of it being written, the others waiting
            assert in_flight.bytes > 0 and in_flight.waiting() > 0
        assert not any(watcher.done() for watcher in hogs)
        _cancel(session, same, small, *hogs)
