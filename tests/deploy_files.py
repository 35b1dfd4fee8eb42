"""What the deploy tests share: the repository's deploy files, read, and the installed
command started and stopped as a container would run it."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from processes import sidecar_command

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
ENTRYPOINT_SCRIPT = ROOT / "deploy" / "docker" / "entrypoint.sh"
KUBE = ROOT / "deploy" / "kubernetes"
SIDECAR = "dsh-system-prompt"
HEALTH = ["dsh-system-prompt", "health", "--address"]
STARTUP_S = 30.0


# --- reading the Dockerfile -------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        keyword, _, rest = (pending + text).partition(" ")
        found.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return found


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage, each list starting with its FROM."""
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def words(arguments: str) -> list[str]:
    """An instruction's arguments: JSON (exec) form or whitespace separated."""
    if arguments.startswith("["):
        parsed = json.loads(arguments)
        assert isinstance(parsed, list)
        return [str(word) for word in parsed]
    return shlex.split(arguments)


def copies(stage: list[tuple[str, str]]) -> list[tuple[dict[str, str], list[str], str]]:
    """(flags, sources, destination) of each COPY in a stage."""
    result = []
    for keyword, rest in stage:
        if keyword != "COPY":
            continue
        parts = words(rest)
        flags = dict(p[2:].partition("=")[::2] for p in parts if p.startswith("--"))
        paths = [p for p in parts if not p.startswith("--")]
        result.append((flags, paths[:-1], paths[-1]))
    return result


def env(stage: list[tuple[str, str]]) -> dict[str, str]:
    """The ENV of a stage (KEY=VALUE form)."""
    values: dict[str, str] = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            values.update(word.partition("=")[::2] for word in shlex.split(rest))
    return values


def only(stage: list[tuple[str, str]], keyword: str) -> str:
    matches = [rest for kw, rest in stage if kw == keyword]
    assert len(matches) == 1, f"expected one {keyword} in the final stage, found {matches}"
    return matches[0]


def health_timeout(command: list[str]) -> float:
    """The --timeout a `health` command line gives (the CLI's default is 10 s)."""
    return float(command[command.index("--timeout") + 1]) if "--timeout" in command else 10.0


# --- reading the manifests --------------------------------------------------------------


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(KUBE.glob("*.yaml")):
        docs.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def deployments() -> dict[str, dict[str, Any]]:
    found = {d["metadata"]["name"]: d for d in documents() if d["kind"] == "Deployment"}
    assert set(found) == {"agent-tcp", "agent-unix-socket"}
    return found


def pod(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = deployments()[name]["spec"]["template"]["spec"]
    return spec


def sidecar_of(spec: dict[str, Any]) -> dict[str, Any]:
    (sidecar,) = [c for c in spec["initContainers"] if c["name"] == SIDECAR]
    return sidecar


def agent_of(spec: dict[str, Any]) -> dict[str, Any]:
    (agent,) = spec["containers"]
    return agent


def container_env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def configmap_toml() -> str:
    (configmap,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    text: str = configmap["data"]["sidecar.toml"]
    return text


# --- processes --------------------------------------------------------------------------


def read_line(process: subprocess.Popen[str], timeout: float = STARTUP_S) -> str:
    """The next stdout line, or fail (with stderr) if none comes in time."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            process.kill()
            _, err = process.communicate()
            pytest.fail(f"no output within {timeout}s; stderr:\n{err}")
    return process.stdout.readline()


def start(args: list[str], extra_env: dict[str, str]) -> subprocess.Popen[str]:
    environment = {**os.environ, **extra_env}
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,  # its own process group, so stop() can clear stragglers
    )


def stop(process: subprocess.Popen[str]) -> int:
    """SIGTERM, then the exit code (killed after a while, with anything it left behind)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=STARTUP_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def bin_path() -> str:
    """PATH with the installed dsh-system-prompt first, as /opt/venv/bin is in the image."""
    return f"{Path(sidecar_command()).parent}{os.pathsep}{os.environ.get('PATH', '')}"
