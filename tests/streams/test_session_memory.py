"""What an open session costs the sidecar's Python heap while it is connected and idle.

A sidecar serves every agent process of its pod for its life, so what each connected
session holds is paid many times over: no task per way a stream can end (one reads,
one future waits for the first end), and flags that hold no waiters' deque up front.
Counted with tracemalloc in the sidecar's own frames: gRPC's share of a stream, and
the clients' (the test's raw streams), are not the sidecar's to save.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import raw_channel

SESSIONS = 50
# 12.1 KiB a session with an asyncio.Event per flag, a task per end of the stream and an
# outbox's empty deque; 6.2 KiB without (the session, its outbox, the reading task, the
# coroutines of the call's interceptions, and gRPC's pending read, made in their frames).
MAX_BYTES_PER_SESSION = 8_192


async def test_an_idle_connected_session_holds_at_most_8_kib_of_the_sidecar_s_heap(
    sidecar: Sidecar,
) -> None:
    async with raw_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)

        async def opened() -> object:
            call = stub.OpenSession()
            await call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="idle")))
            assert (await call.read()).HasField("opened")
            return call

        warm = [await opened() for _ in range(2)]  # whatever the first streams make once
        gc.collect()
        tracemalloc.start(32)
        try:
            before = tracemalloc.take_snapshot()
            calls = [await opened() for _ in range(SESSIONS)]
            await asyncio.sleep(0.2)  # every stream settled in its wait
            gc.collect()
            after = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
        assert len(sidecar.state.sessions) == SESSIONS + len(warm)
        for call in [*warm, *calls]:
            call.cancel()  # type: ignore[attr-defined]
    mine = [tracemalloc.Filter(True, "*/dsh_system_prompt_server/*", all_frames=True)]
    grown = sum(
        stat.size_diff
        for stat in after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename")
    )
    per_session = grown / SESSIONS
    assert per_session <= MAX_BYTES_PER_SESSION, f"{per_session:.0f} bytes per session"
