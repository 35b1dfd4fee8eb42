"""What `serve` loads follows from what is configured: with the default config none of the
optional libraries is imported (the admin page's aiohttp and jinja2, OpenTelemetry,
prometheus_client, python-json-logger, the client library and rich of the client commands,
the rules' CEL); each feature switched on loads its own and works.

The sidecar runs as a real process through the command's own entry point
(`launcher.main`, what `dsh-system-prompt` runs), in a `-c` wrapper that prints the names of
the modules it holds once `main` returns, after a SIGTERM's drain."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_core import HARNESS_IDENTITY_TEXT
from processes import LISTENING, free_port

# The optional libraries by the top-level module each installs.
OPTIONAL = {
    "aiohttp": "admin page",
    "jinja2": "admin page",
    "opentelemetry": "tracing",
    "prometheus_client": "metrics",
    "pythonjsonlogger": "JSON logs",
    "dsh_system_prompt": "client commands",  # the client library
    "rich": "client commands",
    "cel_expr_python": "rules",
}
MODULES = "modules: "
FROZEN = "frozen: "
_WRAPPER = f"""
import gc, json, sys
from dsh_system_prompt_server.sidecar.launcher import main
sys.argv[0] = "dsh-system-prompt"
try:
    code = main()
finally:
    print({MODULES!r} + json.dumps(sorted(sys.modules)), flush=True)
    print({FROZEN!r} + str(gc.get_freeze_count()), flush=True)
sys.exit(code)
"""


def loaded(modules: list[str]) -> set[str]:
    """Which of the optional libraries' top-level modules are among `modules`."""
    return {name.split(".")[0] for name in modules} & set(OPTIONAL)


@dataclass
class Run:
    """A `serve` process of the wrapper: where it listens, then what it held at its end."""

    process: asyncio.subprocess.Process
    address: str
    stderr: Path
    modules: list[str] | None = None
    frozen = 0  # objects out of every garbage collection (gc.freeze), at its end

    async def stop(self) -> list[str]:
        """SIGTERM (the drain), then the modules it held."""
        assert self.process.stdout is not None
        self.process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(self.process.stdout.read(), 30)).decode()
        await asyncio.wait_for(self.process.wait(), 10)
        lines = [line for line in rest.splitlines() if line.startswith(MODULES)]
        assert lines, f"no module list; stderr: {self.stderr.read_text()[-2000:]}"
        self.modules = json.loads(lines[-1][len(MODULES) :])
        frozen = [line for line in rest.splitlines() if line.startswith(FROZEN)]
        self.frozen = int(frozen[-1][len(FROZEN) :])
        return self.modules


@contextlib.asynccontextmanager
async def wrapped(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[Run]:
    """`dsh-system-prompt ARGS` in the wrapper, until it says where it listens."""
    with tempfile.TemporaryDirectory() as folder:
        stderr_path = Path(folder) / "stderr.log"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _WRAPPER,
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env={**os.environ, **(env or {})},
            )
        try:
            assert process.stdout is not None
            line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
            found = LISTENING.search(line)
            assert found, f"printed {line!r}; stderr: {stderr_path.read_text()[-2000:]}"
            yield Run(process, found.group(1), stderr_path)
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.wait_for(process.wait(), 10)


async def use(address: str) -> None:
    """What an agent does: a session, a section, an assemble, its prompt."""
    async with dsp.connect(address, client_name="loads") as client:
        await client.section("rules", 10, "Be brief.")
        assembly = await client.assemble()
        assert "Be brief." in dsp.render_prompt(assembly)


# What only a config file, credentials, server reflection or a report's diff need, by module.
DEFERRED = {
    "tomllib": "a config file",
    "dsh_system_prompt_server.sidecar.reload": "a config file",
    "dsh_system_prompt_server.guard.auth": "credentials",
    "grpc_reflection.v1alpha.reflection": "server reflection",  # (grpc imports the package)
    "difflib": "a report's diff",
}


def deferred(modules: list[str]) -> set[str]:
    """Which of `DEFERRED` (a package or one of its modules) are among `modules`."""
    return {
        name for name in DEFERRED if any(m == name or m.startswith(name + ".") for m in modules)
    }


async def test_serve_with_the_default_config_loads_no_optional_library() -> None:
    async with wrapped("serve", "--listen", "127.0.0.1:0") as run:
        await use(run.address)
        modules = await run.stop()
    assert loaded(modules) == set()
    assert "dsh_system_prompt_server.admin" not in modules
    assert deferred(modules) == {"grpc_reflection.v1alpha.reflection"}  # on by default on loopback


async def test_serve_without_reflection_loads_neither_it_nor_what_no_one_configured() -> None:
    async with wrapped("serve", "--listen", "127.0.0.1:0", "--no-reflection") as run:
        await use(run.address)
        modules = await run.stop()
    assert deferred(modules) == set()


async def test_a_config_file_with_a_credential_loads_toml_reload_and_auth(tmp_path: Path) -> None:
    """The file is read and watched, and the credential checked: a call without it refused."""
    token = tmp_path / "token"
    token.write_text("s3cret-token-for-loads")
    config = tmp_path / "sidecar.toml"
    config.write_text(f'auth_token_file = "{token}"\n')
    async with wrapped("serve", "--listen", "127.0.0.1:0", "--config", str(config)) as run:
        with pytest.raises(dsp.SystemPromptError):
            await use(run.address)
        async with dsp.connect(run.address, client_name="loads", token=token.read_text()) as client:
            await client.section("rules", 10, "Be brief.")
            assert "Be brief." in dsp.render_prompt(await client.assemble())
        modules = await run.stop()
    assert deferred(modules) == {
        "tomllib",
        "dsh_system_prompt_server.sidecar.reload",
        "dsh_system_prompt_server.guard.auth",
        "grpc_reflection.v1alpha.reflection",
    }


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


@pytest.mark.parametrize(
    ("flag", "path", "shown", "libraries"),
    [
        ("--metrics-listen", "/metrics", "dsp_assemble_seconds_count 1.0", {"prometheus_client"}),
        ("--admin-listen", "/sessions", "mean assembly time", {"aiohttp", "jinja2"}),
    ],
)
async def test_an_http_listener_loads_its_libraries_and_serves(
    flag: str, path: str, shown: str, libraries: set[str]
) -> None:
    """`metrics_listen` serves the counts (the assembly just made among them); `admin_listen`
    the admin page (its sessions view counts that assembly)."""
    port = free_port()
    async with wrapped("serve", "--listen", "127.0.0.1:0", flag, f"127.0.0.1:{port}") as run:
        await use(run.address)
        status, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}{path}")
        modules = await run.stop()
    assert status == 200
    assert shown in text
    assert loaded(modules) == libraries


async def test_json_logs_load_the_json_logger_and_write_json() -> None:
    async with wrapped("serve", "--listen", "127.0.0.1:0", "--log-format", "json") as run:
        await use(run.address)
        modules = await run.stop()
        lines = run.stderr.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    assert any(record["message"].startswith("serving on ") for record in records)
    assert loaded(modules) == {"pythonjsonlogger"}


async def test_a_tracing_exporter_loads_opentelemetry() -> None:
    # Where the spans go is tests/telemetry/test_tracing.py's (a receiver across processes);
    # here the exporter is configured and nothing listens: the spans are dropped at the drain.
    environment = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
    }
    async with wrapped("serve", "--listen", "127.0.0.1:0", env=environment) as run:
        await use(run.address)
        modules = await run.stop()
        logs = run.stderr.read_text()
    assert "tracing: spans exported over OTLP/gRPC" in logs
    assert loaded(modules) == {"opentelemetry"}


async def test_client_commands_load_the_client_library_and_rich() -> None:
    async with wrapped("serve", "--listen", "127.0.0.1:0") as run:
        await use(run.address)
        command = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _WRAPPER,
            "assemble",
            "--address",
            run.address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(command.communicate(), 30)
        served = await run.stop()
    prompt, _, modules = out.decode().partition(MODULES)
    assert command.returncode == 0, err.decode()
    assert HARNESS_IDENTITY_TEXT in prompt
    # The client library imports OpenTelemetry's API where installed, for its own spans.
    listed = json.loads(modules.partition(FROZEN)[0])
    assert loaded(listed) - {"opentelemetry"} == {"dsh_system_prompt", "rich"}
    assert loaded(served) == set()


async def test_serve_leaves_what_starting_made_out_of_every_collection() -> None:
    """Modules, classes and descriptors live as long as the process: a full collection,
    which stops the loop, does not walk them (gc.freeze once serving)."""
    async with wrapped("serve", "--listen", "127.0.0.1:0") as run:
        await use(run.address)
        await run.stop()
    assert run.frozen > 10_000
