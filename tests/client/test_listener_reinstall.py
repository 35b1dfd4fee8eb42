"""A listener whose stream the sidecar closed is installed again on the same session: the
client keeps its session and every other registration (issue 34, item 3)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, eventually, metric, section_names

CLIENT_SCRIPT = """
import asyncio, sys
import dsh_system_prompt as dsp

async def mark(assembly, context, next):
    result = await next()
    result.sections.append(dsp.AssembledSection("policy-mark", "checked"))
    return result

async def main():
    client = await dsp.connect(sys.argv[1])
    await client.section("own", 50, "the client's own section")
    await client.on_assemble(mark, name="policy", global_=True)
    print("ready", client.session_id, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _stalled(sidecar: Sidecar) -> float:
    return metric(sidecar, "dsp_stalled_peers_total", kind="listener")


@contextlib.asynccontextmanager
async def _client_process(address: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """The client of CLIENT_SCRIPT in a process of its own (so that it can be frozen), and
    its session id once it is ready."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT_SCRIPT, address, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        ready = (await asyncio.wait_for(process.stdout.readline(), 15)).decode().split()
        assert ready[0] == "ready", ready
        yield process, ready[1]
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.kill()
        await asyncio.wait_for(process.wait(), 5)


@contextlib.asynccontextmanager
async def _frozen(process: asyncio.subprocess.Process) -> AsyncIterator[None]:
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


async def _listeners(sidecar: Sidecar) -> list[str]:
    """The names of the listeners the sidecar has registered."""
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        listing = pb_grpc.SystemPromptServiceStub(channel).ListRegistrations(
            pb.ListRegistrationsRequest()
        )
        return [
            info.name
            async for batch in listing
            for info in batch.registrations
            if info.kind == pb.CHANGE_KIND_LISTENER
        ]


async def test_a_listener_stream_the_sidecar_closed_is_installed_again_on_the_same_session(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=1, eject_after_timeouts=0)
    async with (
        dsp.connect(sidecar.address) as observer,
        _client_process(sidecar.address) as (peer, session_id),
    ):
        big = [await observer.section(f"big{i}", 100 + i, "x") for i in range(6)]
        assert "policy-mark" in section_names(await observer.assemble(timeout=10))
        async with _frozen(peer):  # it reads nothing: the sidecar closes its listener stream
            for index in range(10):  # 1.2 MiB of new text an invocation (part slots send
                for handle in big:  # only what changed)
                    await handle.update(chr(ord("a") + index) * (200 * 1024))
                with contextlib.suppress(dsp.SystemPromptError):
                    await observer.assemble(timeout=5)
                if _stalled(sidecar):
                    break
        assert _stalled(sidecar) == 1

        async def marked_again() -> bool:
            try:
                return "policy-mark" in section_names(await observer.assemble(timeout=5))
            except dsp.SystemPromptError as error:  # away: LISTENER_UNAVAILABLE meanwhile
                assert error.code == grpc.StatusCode.UNAVAILABLE, error
                return False

        await eventually(marked_again, "the listener is installed again", 15)
        # the same session, its own section kept, and one listener "policy", not two
        assert sidecar.state.sessions.is_open(session_id)
        assert "own" in section_names(await observer.assemble(timeout=10))
        assert await _listeners(sidecar) == ["policy"]
