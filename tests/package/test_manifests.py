"""The Kubernetes manifests: valid, and consistent with the Dockerfile and the ConfigMap.

The port, addresses, user, probes and grace period agree across the manifests, the image and
the config; the placeholder agents run for real against the installed command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from deploy_files import (
    HEALTH,
    agent_of,
    bin_path,
    configmap_toml,
    container_env,
    documents,
    health_timeout,
    only,
    pod,
    read_line,
    sidecar_of,
    stages,
    start,
    stop,
)
from dsh_system_prompt_server import parse_config
from dsh_system_prompt_server.config import flat
from processes import free_port

# --- the Kubernetes manifests -----------------------------------------------------------


def test_configmap_is_a_valid_sidecar_config() -> None:
    table = tomllib.loads(configmap_toml())
    config = flat(parse_config(table))
    for key, value in table.items():  # each key is read as written, none dropped
        assert config[key] == value, key


@pytest.mark.parametrize("name", ["agent-tcp", "agent-unix-socket"])
def test_native_sidecar_with_config_security_and_resources(name: str) -> None:
    spec = pod(name)
    sidecar = sidecar_of(spec)
    assert sidecar["restartPolicy"] == "Always", "a native sidecar is an Always init container"
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(sidecar)
    config = container_env(sidecar)["DSP_CONFIG"]
    (configmap,) = [d for d in documents() if d["kind"] == "ConfigMap"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in sidecar["volumeMounts"] if m["mountPath"] == str(Path(config).parent)]
    assert volumes[mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"]
    assert Path(config).name in configmap["data"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in [*spec["initContainers"], *spec["containers"]]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind])


@pytest.mark.parametrize("name", ["agent-tcp", "agent-unix-socket"])
def test_grace_period_covers_the_sidecar_drain(name: str) -> None:
    """The agent stops first, then the sidecar drains: leave the agent at least 10 s."""
    grace_s = parse_config(tomllib.loads(configmap_toml())).shutdown_grace_s
    assert pod(name)["terminationGracePeriodSeconds"] >= grace_s + 10


def test_tcp_variant_ports_and_grpc_probes() -> None:
    spec = pod("agent-tcp")
    sidecar = sidecar_of(spec)
    port = int(only(stages()[-1], "EXPOSE"))
    assert container_env(sidecar)["DSP_LISTEN"] == f"0.0.0.0:{port}", "probes dial the pod IP"
    assert [p["containerPort"] for p in sidecar["ports"]] == [port]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[probe]["grpc"]["port"] == port
        assert "service" not in sidecar[probe]["grpc"], "the overall ('') health status"
    assert container_env(agent_of(spec))["DSP_ADDRESS"] == f"127.0.0.1:{port}"


def test_unix_socket_variant_shares_the_socket_and_probes_it() -> None:
    spec = pod("agent-unix-socket")
    sidecar, agent = sidecar_of(spec), agent_of(spec)
    listen = container_env(sidecar)["DSP_LISTEN"]
    assert listen.startswith("unix:/")
    assert container_env(sidecar)["DSP_HEALTH_ADDRESS"] == listen
    assert container_env(agent)["DSP_ADDRESS"] == listen
    assert "ports" not in sidecar
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = sidecar[probe]["exec"]["command"]
        assert command[:4] == [*HEALTH, listen]
        assert health_timeout(command) < sidecar[probe]["timeoutSeconds"]
    folder = str(Path(listen.removeprefix("unix:")).parent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    for container in (sidecar, agent):
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
        assert "emptyDir" in volumes[mount["name"]]
        assert not mount.get("readOnly"), "the agent must connect, the sidecar create"


def test_unix_socket_probe_command_reports_serving(tmp_path: Path, sidecar_on: Any) -> None:
    address = sidecar_on(f"unix:{tmp_path}/dsp.sock")
    probe = sidecar_of(pod("agent-unix-socket"))["livenessProbe"]["exec"]["command"]
    command = [address if word.startswith("unix:") else word for word in probe]  # this socket
    environment = {**os.environ, "PATH": bin_path()}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ["agent-tcp", "agent-unix-socket"])
def test_placeholder_agent_reaches_the_sidecar(name: str, tmp_path: Path, sidecar_on: Any) -> None:
    """Each placeholder agent, run as written, finds a real sidecar and stops on SIGTERM."""
    agent = agent_of(pod(name))
    if name == "agent-tcp":
        address = sidecar_on(f"127.0.0.1:{free_port()}")
    else:
        address = sidecar_on(f"unix:{tmp_path}/dsp.sock")
    assert agent["command"][0] == "python"
    process = start(
        [sys.executable, *agent["command"][1:], *agent["args"]], {"DSP_ADDRESS": address}
    )
    try:
        assert read_line(process).strip() == f"agent placeholder: sidecar reachable at {address}"
    finally:
        assert stop(process) == 0
