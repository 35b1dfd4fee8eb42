"""The built distribution: the wheel alone is a slim client that talks to an installed sidecar,
and both the wheel and the sdist carry the contract and the licence."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import run, serve

ROOT = Path(__file__).resolve().parents[2]
PROTO = "dsh/systemprompt/v1/system_prompt.proto"
# What only the sidecar needs (the `server` extra): none of it may come with the client.
SERVER_ONLY = {
    "grpcio-health-checking",
    "grpcio-reflection",
    "prometheus-client",
    "python-json-logger",
    "rich",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
}
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "MANIFEST.in",
    "core",
    "client",
    "server",
    "proto",
)

_CLIENT = """
import asyncio, sys
import dsh_system_prompt as dsp

async def main():
    async with dsp.connect(sys.argv[1], wait_for_ready=True, timeout=10) as client:
        await client.section("wheel", 5, lambda ctx: f"Installed client, {ctx.get('who')}.")
        print((await client.render(fields={"who": "hello"})).prompt.splitlines()[-1])

asyncio.run(main())
"""

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel and the sdist, built from a copy of the sources (the tree stays clean)."""
    folder = tmp_path_factory.mktemp("dist")
    source = folder / "src"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=skip)
        else:
            shutil.copy(ROOT / name, source / name)
    build = (
        "from setuptools import build_meta as b; b.build_wheel('../out'); b.build_sdist('../out')"
    )
    subprocess.run(
        [sys.executable, "-c", build], cwd=source, check=True, capture_output=True, timeout=120
    )
    yield folder / "out"


@pytest.fixture(scope="module")
def client_venv(dist: Path) -> Path:
    """A fresh virtual environment with only the wheel (and what it requires) installed."""
    venv = dist.parent / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    wheel = next(dist.glob("*.whl"))
    subprocess.run([venv / "bin" / "pip", "install", "--quiet", wheel], check=True, timeout=240)
    return venv


def test_the_wheel_ships_the_proto_and_the_licence(dist: Path) -> None:
    names = zipfile.ZipFile(next(dist.glob("*.whl"))).namelist()
    assert PROTO in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names
    shipped = zipfile.ZipFile(next(dist.glob("*.whl"))).read(PROTO)
    assert shipped == (ROOT / "proto" / PROTO).read_bytes()


def test_the_sdist_ships_the_proto_and_the_licence(dist: Path) -> None:
    with tarfile.open(next(dist.glob("*.tar.gz"))) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {f"proto/{PROTO}", "LICENSE"} <= names


def test_the_client_install_pulls_no_server_dependency(client_venv: Path) -> None:
    listed = subprocess.run(
        [client_venv / "bin" / "pip", "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    installed = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert "dsh-system-prompt" in installed
    assert installed & SERVER_ONLY == set()


async def test_the_installed_client_talks_to_the_installed_sidecar(client_venv: Path) -> None:
    async with serve("--listen", "127.0.0.1:0") as served:
        ran = await run(client_venv / "bin" / "python", "-c", _CLIENT, served.address, timeout=60)
    assert ran == (0, "Installed client, hello.\n", "")


def test_the_command_without_the_server_extra_says_what_to_install(client_venv: Path) -> None:
    ran = subprocess.run(
        [client_venv / "bin" / "dsh-system-prompt", "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 2
    assert "pip install 'dsh-system-prompt[server]'" in ran.stderr
