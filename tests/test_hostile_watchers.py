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
