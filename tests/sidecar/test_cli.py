"""The `dsh-system-prompt serve` command, health, reflection and draining."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh_system_prompt_server import Sidecar
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import (
    IDENTITY,
    SidecarFactory,
    eventually,
    raw_channel,
    rejection,
    section_names,
    tool,
    tool_names,
)
from processes import serve, serve_config, sidecar_command

SERVICE = "dsh.systemprompt.v1.SystemPromptService"


def _serve_and_fail(tmp_path: Path, toml: str) -> subprocess.CompletedProcess[str]:
    """Run serve with a config that must be refused; it must exit on its own."""
    config = tmp_path / "sidecar.toml"
    config.write_text(toml)
    return subprocess.run(
        [sidecar_command(), "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )


async def _health(address: str, service: str = "") -> int:
    async with raw_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    return int(reply.status)


# -- serve ---------------------------------------------------------------------------


async def test_serve_prints_listening_on_the_bound_tcp_address() -> None:
    async with serve("--listen", "127.0.0.1:0") as served:
        found = re.search(r"listening on 127\.0\.0\.1:(\d+)", served.line)
        assert found is not None, served.line
        assert int(found.group(1)) > 0


async def test_a_client_can_assemble_from_the_served_address() -> None:
    async with (
        serve("--listen", "127.0.0.1:0") as served,
        dsp.connect(served.address) as client,
    ):
        await client.section("rules", 10, "Be precise.")
        rendered = await client.render(timeout=5)
    assert rendered.prompt == f"{IDENTITY}\n\nBe precise."


async def test_serve_listens_on_a_unix_socket() -> None:
    directory = tempfile.mkdtemp(prefix="dsp-", dir="/tmp")
    path = f"{directory}/sidecar.sock"
    try:
        async with serve("--listen", f"unix:{path}") as served:
            assert path in served.line
            async with dsp.connect(f"unix:{path}") as client:
                assembly = await client.assemble(timeout=5)
        assert section_names(assembly) == ["harness:identity", dsp.PERSONA_SECTION]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _serve_once(*args: str) -> subprocess.CompletedProcess[str]:
    """Run serve with arguments it must refuse; it must exit on its own."""
    return subprocess.run(
        [sidecar_command(), "serve", *args], capture_output=True, text=True, timeout=15, check=False
    )


async def test_a_second_serve_on_a_live_tcp_address_exits_1_and_the_first_keeps_serving() -> None:
    async with serve("--listen", "127.0.0.1:0") as first:
        second = await asyncio.to_thread(_serve_once, "--listen", first.address)
        assert second.returncode == 1
        assert f"cannot serve on {first.address}: address in use" in second.stderr
        assert "listening on" not in second.stdout
        async with dsp.connect(first.address) as client:
            await client.section("rules", 10, "Be precise.")
            assert section_names(await client.assemble(timeout=5))[-1] == "rules"


async def test_a_second_serve_on_a_live_unix_socket_exits_1_and_leaves_the_socket() -> None:
    directory = tempfile.mkdtemp(prefix="dsp-", dir="/tmp")
    address = f"unix:{directory}/sidecar.sock"
    try:
        async with serve("--listen", address), dsp.connect(address) as client:
            second = await asyncio.to_thread(_serve_once, "--listen", address)
            assert second.returncode == 1
            assert f"cannot serve on {address}: address in use" in second.stderr
            await client.section("rules", 10, "Be precise.")  # the same sidecar, still there
            async with dsp.connect(address) as other:
                assert section_names(await other.assemble(timeout=5))[-1] == "rules"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def test_a_stale_unix_socket_file_is_replaced() -> None:
    directory = tempfile.mkdtemp(prefix="dsp-", dir="/tmp")
    path = f"{directory}/sidecar.sock"
    try:
        with socket.socket(socket.AF_UNIX) as stale:
            stale.bind(path)  # a socket file that nothing listens on
        async with serve("--listen", f"unix:{path}"), dsp.connect(f"unix:{path}") as client:
            assert section_names(await client.assemble(timeout=5))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize(
    "listen", ["localhost", "127.0.0.1", "localhost:", "localhost:http", "::1:50051", "unix:"]
)
def test_a_listen_address_without_a_port_is_a_usage_error(listen: str) -> None:
    result = _serve_once("--listen", listen)
    assert result.returncode == 2
    assert "--listen" in result.stderr and repr(listen) in result.stderr
    assert "listening on" not in result.stdout


def test_a_listen_port_over_65535_is_a_usage_error() -> None:
    result = _serve_once("--listen", "127.0.0.1:99999")
    assert result.returncode == 2
    assert "port 99999 is not 0 to 65535" in result.stderr


async def test_config_file_persona_and_identity_switch_are_honoured(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serve_config(
        config, 'persona = "You are Ada."\ninclude_harness_identity = false\n'
    ) as (_, client):
        assembly = await client.assemble(timeout=5)
    assert assembly.sections == [dsp.AssembledSection(dsp.PERSONA_SECTION, "You are Ada.")]


async def test_config_file_tool_order_is_honoured(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serve_config(
        config, 'tool_order = ["todo_write", "<unlisted-tools>", "bash"]\n'
    ) as (_, client):
        await client.tools([tool("bash"), tool("zeta"), tool("alpha"), tool("todo_write")])
        assembly = await client.assemble(timeout=5)
    assert tool_names(assembly) == ["todo_write", "alpha", "zeta", "bash"]


def test_tool_order_without_the_rest_entry_stops_the_sidecar(tmp_path: Path) -> None:
    result = _serve_and_fail(tmp_path, 'tool_order = ["bash", "todo_write"]\n')
    assert result.returncode != 0
    assert 'toolOrder must contain the "<unlisted-tools>" rest entry' in result.stderr
    assert "listening on" not in result.stdout


def test_tool_order_with_a_duplicate_stops_the_sidecar(tmp_path: Path) -> None:
    result = _serve_and_fail(tmp_path, 'tool_order = ["bash", "<unlisted-tools>", "bash"]\n')
    assert result.returncode != 0
    assert 'toolOrder lists "bash" more than once' in result.stderr
    assert "listening on" not in result.stdout


def test_tool_order_with_the_rest_entry_twice_stops_the_sidecar(tmp_path: Path) -> None:
    result = _serve_and_fail(
        tmp_path, 'tool_order = ["<unlisted-tools>", "bash", "<unlisted-tools>"]\n'
    )
    assert result.returncode != 0
    assert "listening on" not in result.stdout


@pytest.mark.parametrize(
    ("key", "toml"),
    [
        ("persona", "persona = 3"),
        ("include_harness_identity", 'include_harness_identity = "yes"'),
        ("include_runtime_context", "include_runtime_context = 1"),
        ("tool_order", 'tool_order = "bash"'),
        ("provider_timeout_s", "provider_timeout_s = -1"),
        ("provider_timeout_s", 'provider_timeout_s = "5"'),
        ("shutdown_grace_s", "shutdown_grace_s = -1"),
    ],
)
def test_a_config_value_of_the_wrong_type_or_range_stops_the_sidecar_naming_the_key(
    tmp_path: Path, key: str, toml: str
) -> None:
    result = _serve_and_fail(tmp_path, toml + "\n")
    assert result.returncode != 0
    assert key in result.stderr
    assert "listening on" not in result.stdout


def _bad_files(folder: Path) -> dict[str, Path]:
    """Files a config may wrongly point at: missing, a directory, not UTF-8, empty."""
    (folder / "latin1").write_bytes(b"caf\xe9-token\n")
    (folder / "empty").write_text("\n")
    (folder / "garbage.pem").write_text("not a certificate\n")
    return {
        "missing": folder / "missing",
        "directory": folder,
        "latin1": folder / "latin1",
        "empty": folder / "empty",
        "garbage": folder / "garbage.pem",
    }


@pytest.mark.parametrize(
    ("key", "toml"),
    [
        ("provider_timeout_s", "provider_timeout_s = 1e308"),
        ("provider_timeout_s", "provider_timeout_s = inf"),
        ("provider_timeout_s", "provider_timeout_s = nan"),
        ("dead_peer_timeout_s", "dead_peer_timeout_s = 1e12"),
        ("shutdown_grace_s", "shutdown_grace_s = 1e300"),
        ("watch_buffer", "watch_buffer = 9223372036854775807"),
        ("change_history", "change_history = 0"),
        ("change_history", "change_history = 1000001"),
        ("prompt_coalesce_s", "prompt_coalesce_s = -1"),
        ("prompt_coalesce_s", 'prompt_coalesce_s = "fast"'),
        ("watch_coalesce_s", "watch_coalesce_s = 1.5"),
        ("watch_coalesce_s", "watch_coalesce_s = -0.1"),
        ("fair_share.lag_s", "[fair_share]\nlag_s = 1.5"),
        ("fair_share.lag_s", "[fair_share]\nlag_s = -0.001"),
        ("fair_share.lag_s", '[fair_share]\nlag_s = "soon"'),
        ("fair_share.over", "[fair_share]\nover = 0.5"),
        ("fair_share.floor", "[fair_share]\nfloor = 2"),
        ("fair_share.max_wait_s", "[fair_share]\nmax_wait_s = 0"),
        ("fair_share.window_s", "[fair_share]\nwindow_s = 600"),
        ("fair_share_lag_s", "fair_share_lag_s = 0.001"),  # moved: the refusal names where
        ("limits.max_watchers_per_peer", "[limits]\nmax_watchers_per_peer = 0"),
        ("report_history", "report_history = 9223372036854775807"),
        ("limits.max_message_bytes", "[limits]\nmax_message_bytes = 9223372036854775807"),
        ("limits.max_message_bytes", "[limits]\nmax_message_bytes = 4294967296"),
        ("limits.max_sessions", "[limits]\nmax_sessions = 0"),
        ("limits.max_sessions_per_peer", "[limits]\nmax_sessions_per_peer = 0"),
        ("limits.max_listeners_per_peer", "[limits]\nmax_listeners_per_peer = 0"),
        ("limits.max_bytes_per_peer", "[limits]\nmax_bytes_per_peer = 2147483648"),
        ("limits.max_text_bytes", "[limits]\nmax_text_bytes = -5"),
        ("metrics_listen", 'metrics_listen = "nonsense"'),
        ("metrics_listen", 'metrics_listen = "127.0.0.1:99999"'),
        ("metrics_listen", 'metrics_listen = "localhost"'),
        ("metrics_key_labels", 'metrics_key_labels = "yes"'),
        ("persona", 'persona = "You are {{{{ name }}}}."'),  # format() halves the braces
        ("auth_token_file", 'auth_token_file = "{missing}"'),
        ("auth_token_file", 'auth_token_file = "{directory}"'),
        ("auth_token_file", 'auth_token_file = "{latin1}"'),
        ("auth_token_file", 'auth_token_file = "{empty}"'),
        ("auth_token_file", 'auth_token_file = "\\u0000"'),
        ("tls_cert_file", 'tls_cert_file = "{missing}"\ntls_key_file = "{garbage}"'),
        ("tls_cert_file", 'tls_cert_file = "{garbage}"\ntls_key_file = "{garbage}"'),
        ("tls_cert_file", 'tls_cert_file = "{directory}"\ntls_key_file = "{garbage}"'),
        ("tls_key_file", 'tls_cert_file = "{garbage}"'),
        ("tls_cert_file", 'tls_key_file = "{garbage}"'),
        ("tls_client_ca_file", 'tls_client_ca_file = "{garbage}"'),
    ],
)
def test_a_bad_config_value_exits_2_naming_the_key_and_the_file(
    tmp_path: Path, key: str, toml: str
) -> None:
    files = _bad_files(tmp_path)
    result = _serve_and_fail(tmp_path, toml.format(**{k: str(v) for k, v in files.items()}))
    assert result.returncode == 2, result.stderr
    assert f"'{key}'" in result.stderr
    named = [str(path) for name, path in files.items() if "{" + name + "}" in toml]
    assert not named or named[0] in result.stderr
    assert "Traceback" not in result.stderr
    assert "listening on" not in result.stdout


def test_a_config_file_that_is_not_utf8_exits_2_naming_the_file(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_bytes(b'persona = "caf\xe9"\n')
    result = _serve_once("--listen", "127.0.0.1:0", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert f"config file {config} is not UTF-8 text" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_metrics_port_in_use_exits_2_naming_the_key() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = _serve_once("--listen", "127.0.0.1:0", "--metrics-listen", address)
    assert result.returncode == 2, result.stderr
    assert f"'metrics_listen': cannot serve on {address}: address in use" in result.stderr
    assert "Traceback" not in result.stderr


async def test_sigterm_exits_zero() -> None:
    async with serve("--listen", "127.0.0.1:0") as served:
        served.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(served.process.wait(), 15) == 0


async def test_sigterm_with_a_session_open_exits_zero() -> None:
    async with serve("--listen", "127.0.0.1:0") as served:
        client = await dsp.connect(served.address)
        try:
            await client.section("rules", 10, lambda ctx: "dynamic")
            await client.assemble(timeout=5)
            served.process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(served.process.wait(), 15) == 0
        finally:
            await asyncio.wait_for(client.close(), 10)


async def test_sigterm_lets_an_in_flight_assembly_finish_and_refuses_new_calls() -> None:
    async with serve("--listen", "127.0.0.1:0") as served, held_assembly(served.address) as held:
        served.process.send_signal(signal.SIGTERM)
        await eventually(lambda: _not_serving(served.address), "health reads NOT_SERVING")
        error = await rejection(held.client.assemble(timeout=5))
        assert error.code == grpc.StatusCode.UNAVAILABLE

        held.release.set()
        assembly = await asyncio.wait_for(held.in_flight, 10)
        assert assembly.sections[-1] == dsp.AssembledSection("slow", "slow text")
        assert await asyncio.wait_for(served.process.wait(), 15) == 0


@dataclass(frozen=True)
class Held:
    """A client whose assembly is in flight, its provider waiting for `release`."""

    client: dsp.Client
    in_flight: asyncio.Task[dsp.PromptAssembly]
    release: asyncio.Event


@contextlib.asynccontextmanager
async def held_assembly(address: str, timeout: float = 10) -> AsyncIterator[Held]:
    """A client of `address` with an assembly (of `timeout`) held in its provider."""
    client = await dsp.connect(address)
    try:
        asked, release = asyncio.Event(), asyncio.Event()

        async def slow(ctx: dsp.AssembleContext) -> str:
            asked.set()
            await release.wait()
            return "slow text"

        await client.section("slow", 1, slow)
        in_flight = asyncio.create_task(client.assemble(timeout=timeout))
        await asyncio.wait_for(asked.wait(), 5)
        yield Held(client=client, in_flight=in_flight, release=release)
    finally:
        await asyncio.wait_for(client.close(), 10)


@contextlib.asynccontextmanager
async def draining(sidecar: Sidecar) -> AsyncIterator[asyncio.Task[None]]:
    """`sidecar` draining, once its health reads NOT_SERVING; the drain, cancelled after."""
    drain = asyncio.create_task(sidecar.drain())
    try:
        await eventually(lambda: _not_serving(sidecar.address), "health reads NOT_SERVING")
        yield drain
    finally:
        drain.cancel()  # nothing when it has finished


async def _not_serving(address: str) -> bool:
    return await _health(address) == health_pb2.HealthCheckResponse.NOT_SERVING


# -- health and reflection -----------------------------------------------------------


async def test_health_answers_serving() -> None:
    async with serve("--listen", "127.0.0.1:0") as served:
        assert await _health(served.address) == health_pb2.HealthCheckResponse.SERVING


async def test_health_answers_serving_for_the_system_prompt_service() -> None:
    async with serve("--listen", "127.0.0.1:0") as served:
        assert await _health(served.address, SERVICE) == health_pb2.HealthCheckResponse.SERVING


async def test_reflection_lists_the_system_prompt_service() -> None:
    async with serve("--listen", "127.0.0.1:0") as served, raw_channel(served.address) as channel:
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=5)
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = await call.read()
        await call.done_writing()
    names = [service.name for service in reply.list_services_response.service]
    assert SERVICE in names
    assert "grpc.health.v1.Health" in names


async def test_reflection_describes_the_contract_package() -> None:
    async with serve("--listen", "127.0.0.1:0") as served, raw_channel(served.address) as channel:
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=5)
        await call.write(reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE))
        reply = await call.read()
        await call.done_writing()
    assert reply.WhichOneof("message_response") == "file_descriptor_response"


# -- drain, in process ---------------------------------------------------------------


async def test_drain_turns_health_not_serving_and_refuses_new_calls(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar()
    async with held_assembly(sidecar.address) as held, draining(sidecar) as drain:
        refused_call = await rejection(held.client.assemble(timeout=5))
        assert refused_call.code == grpc.StatusCode.UNAVAILABLE
        refused_registration = await rejection(held.client.section("late", 2, "too late"))
        assert refused_registration.code == grpc.StatusCode.UNAVAILABLE

        held.release.set()
        assembly = await asyncio.wait_for(held.in_flight, 10)
        assert assembly.sections[-1] == dsp.AssembledSection("slow", "slow text")
        await asyncio.wait_for(drain, 10)


async def test_drain_refuses_new_sessions(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar()
    async with held_assembly(sidecar.address) as held, draining(sidecar) as drain:
        refused = await rejection(dsp.connect(sidecar.address), within=5)
        assert refused.code == grpc.StatusCode.UNAVAILABLE

        held.release.set()
        await asyncio.wait_for(held.in_flight, 10)
        await asyncio.wait_for(drain, 10)


async def test_drain_cancels_an_assembly_that_outlives_the_grace_period(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(shutdown_grace_s=0.2)
    async with held_assembly(sidecar.address, timeout=30) as held:  # never released
        await asyncio.wait_for(sidecar.drain(), 10)
        await rejection(held.in_flight, within=10)
