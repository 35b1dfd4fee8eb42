"""What a new user meets first: connecting (waiting for the sidecar, the default address),
errors that say what happened, context managers, exported types, names, a quiet stderr."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, rejection, section_names, tool, tool_names
from processes import free_port


async def test_wait_for_ready_connects_once_the_sidecar_comes_up(
    make_sidecar: SidecarFactory,
) -> None:
    address = f"127.0.0.1:{free_port()}"

    async def agent() -> dsp.Client:  # started before its sidecar, as in a pod
        return await dsp.connect(address, wait_for_ready=True, timeout=20)

    connecting = asyncio.create_task(agent())
    done, _ = await asyncio.wait({connecting}, timeout=0.3)
    assert not done  # still waiting, not failed
    await make_sidecar(address)
    async with await asyncio.wait_for(connecting, 20) as client:
        await client.section("late", 1, "The sidecar came up after the agent.")
        assert "late" in section_names(await client.assemble())


async def test_wait_for_ready_gives_up_after_its_timeout_with_unavailable() -> None:
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    error = await rejection(dsp.connect(address, wait_for_ready=True, timeout=0.5))
    assert time.monotonic() - started >= 0.5
    assert (error.code, error.reason) == (
        grpc.StatusCode.UNAVAILABLE,
        dsp.Reason.SIDECAR_UNAVAILABLE,
    )
    assert error.message == f"sidecar unavailable: no session with {address} within 0.5s"


async def test_connect_without_waiting_fails_at_once_when_nothing_listens() -> None:
    started = time.monotonic()
    error = await rejection(dsp.connect(f"127.0.0.1:{free_port()}", timeout=10))
    assert time.monotonic() - started < 5
    assert error.reason == dsp.Reason.SIDECAR_UNAVAILABLE


async def test_connect_without_waiting_outlasts_a_sidecar_slow_to_take_the_connection(
    sidecar: Sidecar,
) -> None:
    """A loaded host can take longer than a moment to connect: here a relay holds each
    connection 0.5 s before it reaches the sidecar. gRPC takes min_reconnect_backoff_ms as
    each attempt's connect timeout, which at 100 ms failed such a connect UNAVAILABLE."""
    host, port = sidecar.address.rsplit(":", 1)
    relays: list[asyncio.Task[None]] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relays.append(asyncio.current_task())  # type: ignore[arg-type]
        await asyncio.sleep(0.5)  # the slow host: what is awaited is the connect itself
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with dsp.connect(address) as client:
            assert client.session_id
    finally:
        server.close()
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)


async def test_connect_defaults_to_dsp_address(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSP_ADDRESS", sidecar.address)
    async with dsp.connect() as client:
        assert client.session_id
    assert dsp.default_address() == sidecar.address


def test_the_default_address_without_dsp_address_is_loopback_50051(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DSP_ADDRESS", raising=False)
    assert dsp.default_address() == "127.0.0.1:50051"


async def test_an_error_prints_its_code_reason_and_message(client: dsp.Client) -> None:
    await client.section("rules", 1, "x")
    error = await rejection(client.section("rules", 2, "y"))
    assert str(error) == f"ALREADY_EXISTS DUPLICATE_NAME: {error.message}"
    assert "rules" in error.message


async def test_a_client_closes_its_session_when_its_block_ends(sidecar: Sidecar) -> None:
    client = await dsp.connect(sidecar.address)
    async with client:
        await client.section("mine", 1, "x")
    async with dsp.connect(sidecar.address) as other:
        assert "mine" not in section_names(await other.assemble())
    error = await rejection(client.assemble())
    assert error.reason == dsp.Reason.SESSION_CLOSED


async def test_a_scope_disposes_what_it_registered_when_its_block_ends(
    client: dsp.Client,
) -> None:
    async with await client.scope("agent-1") as agent:
        await agent.section("agent-rules", 1, "x")
        assert "agent-rules" in section_names(await client.assemble("agent-1"))
    assert "agent-rules" not in section_names(await client.assemble("agent-1"))


async def test_a_disposer_disposes_its_registration_when_its_block_ends(
    client: dsp.Client,
) -> None:
    async with await client.tools([tool("bash")]):
        assert tool_names(await client.assemble()) == ["bash"]
    assert tool_names(await client.assemble()) == []


async def test_listener_next_and_provider_types_are_exported(client: dsp.Client) -> None:
    async def sign(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
    ) -> dsp.PromptAssembly:
        assembly.sections.append(dsp.AssembledSection("signed", "signed"))
        return await next()

    listener: dsp.Listener = sign
    text: dsp.TextProvider = lambda ctx: "dynamic"  # noqa: E731
    tools: dsp.ToolsProvider = lambda ctx: [tool("t")]  # noqa: E731
    value: dsp.VariableProvider = lambda ctx: None  # noqa: E731
    await client.on_assemble(listener)
    await client.section("dyn", 1, text)
    await client.tools(tools)
    await client.variable("v", value)
    assembly = await client.assemble()
    assert section_names(assembly)[-2:] == ["dyn", "signed"]


async def test_name_labels_a_listener_in_its_errors(client: dsp.Client) -> None:
    async def broken(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
    ) -> dsp.PromptAssembly:
        raise ValueError("no signature")

    await client.on_assemble(broken, name="sign")
    error = await rejection(client.assemble())
    assert error.message == 'listener "sign" failed: ValueError: no signature'


async def test_name_labels_a_tools_provider_in_its_errors(client: dsp.Client) -> None:
    def broken(context: dsp.AssembleContext) -> list[dsp.ToolSchema]:
        raise ValueError("no tools today")

    await client.tools(broken, name="shell-tools")
    error = await rejection(client.assemble())
    assert 'tools provider "shell-tools" (global) failed' in error.message


_FORKING_AGENT = """
import asyncio, os, sys
import dsh_system_prompt as dsp

async def main():
    async with dsp.connect(sys.argv[1]) as client:
        await client.section("s", 1, lambda ctx: "dynamic")
        for _ in range(3):  # an agent running tools: fork while gRPC's threads are busy
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            await client.assemble()

asyncio.run(main())
"""


@pytest.mark.parametrize(("verbosity", "quiet"), [(None, True), ("info", False)])
async def test_grpc_core_log_lines_stay_out_of_stderr_unless_asked_for(
    sidecar: Sidecar, verbosity: str | None, quiet: bool
) -> None:
    env = {"PATH": "/usr/bin:/bin"} | ({"GRPC_VERBOSITY": verbosity} if verbosity else {})
    process = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _FORKING_AGENT, sidecar.address],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert process.returncode == 0, process.stderr
    assert (process.stderr == "") is quiet, process.stderr
