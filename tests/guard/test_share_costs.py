"""What each call costs its client's share: gRPC's work for a request, a message a stream
reads and a watched prompt's bytes, counted however little the servicer's own steps take."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server.guard.charging import CALL_S, MESSAGE_S, wire_s
from helpers import SidecarFactory

from guard.test_fair_shares import HOG, TOKENS, credentials


async def test_a_request_refused_for_its_size_costs_its_client_its_bytes(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(**credentials(tmp_path))
    request = pb.AssembleRequest(context=pb.AssembleContext(fields_json="x" * (3 << 20)))
    metadata = (("authorization", f"Bearer {TOKENS['hog']}"),)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Assemble(request, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    shares = sidecar.state.shares
    # gRPC's work for the 15 MiB received, though the servicer refused each by its size
    assert shares.use(HOG) * shares.settings.window_s > 0.5 * wire_s(5 * request.ByteSize())


async def counting_sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Any:
    """A sidecar with credentials whose shares forget nothing within the test."""
    sidecar = await make_sidecar(**credentials(tmp_path))
    shares = sidecar.state.shares
    shares.settings = dataclasses.replace(shares.settings, window_s=1000.0, idle=0.0)
    return sidecar


def charged_s(sidecar: Any, key: str) -> float:
    shares = sidecar.state.shares
    return float(shares.use(key) * shares.settings.window_s)


async def test_each_call_costs_its_client_grpcs_work_for_it_however_little_its_steps_take(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    async with dsp.connect(sidecar.address, token=TOKENS["hog"]) as client:
        before = charged_s(sidecar, HOG)
        for _ in range(100):  # answered from the response cache: steps of microseconds
            await client.assemble()
    assert charged_s(sidecar, HOG) - before >= 0.9 * 100 * CALL_S


async def test_each_message_a_stream_reads_costs_its_client_grpcs_work_for_it(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    metadata = (("authorization", f"Bearer {TOKENS['hog']}"),)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        session = stub.OpenSession(metadata=metadata)
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="s")))
        await session.read()
        before = charged_s(sidecar, HOG)
        for index in range(100):  # read by the sidecar and answered with nothing
            invalidate = pb.CacheInvalidate(invalidate_id=index + 1)
            await session.write(pb.OpenSessionRequest(invalidate=invalidate))
        await session.done_writing()  # the session ends once the sidecar read them all
        while await session.read() is not grpc.aio.EOF:
            pass
    assert charged_s(sidecar, HOG) - before >= 0.9 * 100 * MESSAGE_S


async def test_a_prompt_watchers_first_prompt_costs_its_client_its_bytes(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    parts = ["abcdefghijklmn"[index] * 250_000 for index in range(14)]  # 3.5 MB
    async with (
        dsp.connect(sidecar.address, token=TOKENS["light"]) as writer,
        dsp.connect(sidecar.address, token=TOKENS["hog"]) as watcher,
    ):
        for index, text in enumerate(parts):
            await writer.section(f"large-{index}", 5 + index, text)
        built = await writer.watch_prompt()  # the scope's prompt, built once for both
        await asyncio.wait_for(anext(built), 10)
        before = charged_s(sidecar, HOG)
        prompts = await watcher.watch_prompt()
        first = await asyncio.wait_for(anext(prompts), 10)
        assert first.assembly is not None and first.assembly.sections[-1].text == parts[-1]
        assert charged_s(sidecar, HOG) - before >= wire_s(sum(map(len, parts)))


async def test_a_providers_answer_costs_the_client_whose_assembly_asked_for_it_its_bytes(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await counting_sidecar(make_sidecar, tmp_path)
    answer = "x" * (3 << 20)  # over max_text_bytes: each assembly fails once it is read
    async with (
        dsp.connect(sidecar.address, token=TOKENS["light"]) as provider,
        dsp.connect(sidecar.address, token=TOKENS["hog"]) as asker,
    ):
        await provider.section("wide", 1, lambda ctx: answer)
        before = charged_s(sidecar, HOG)
        for turn in range(8):
            with pytest.raises(dsp.SystemPromptError):
                await asker.assemble(fields={"turn": turn})
    # read by the sidecar in no call's step: the asking client pays, as for its request
    assert charged_s(sidecar, HOG) - before >= 8 * wire_s(len(answer))
