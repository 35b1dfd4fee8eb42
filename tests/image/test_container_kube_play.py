"""`podman kube play` of deploy/kubernetes/, with the ConfigMap given by --configmap.

What podman 4.3 (Debian bookworm) does with the manifests as they are: it refuses the
native sidecar ("cannot create an init container that has either of lifecycle,
livenessProbe, readinessProbe, or startupProbe set"); without the probes it would run the
sidecar as a run-once init container and wait for it to exit before starting the agent,
which never happens. So each manifest is played as it is (and must either run, on a podman
that knows native sidecars, or be refused for exactly that reason), then played again with
the sidecar moved to an ordinary container, its probes, env, mounts and security context
unchanged, and that pod is checked as the manifest describes it.

The agent's placeholder image (python:3.11-slim) may not be pullable here: the copy runs the
placeholder in the sidecar's image, which has a Python too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from engine import RUN_ID, Cleanup, Container, eventually, image, podman
from kube import KUBE, agent_spec, config_files, env_of, pod_spec, sidecar_spec

MANIFESTS = ["agent-unix-socket.yaml", "agent-tcp.yaml"]
NATIVE_SIDECAR_REFUSED = "cannot create an init container that has either of lifecycle"
CONNECTS = """
import os, socket, sys
address = os.environ["DSP_ADDRESS"]
if address.startswith("unix:"):
    connection = socket.socket(socket.AF_UNIX)
    connection.settimeout(5)
    connection.connect(address.removeprefix("unix:"))
else:
    host, _, port = address.rpartition(":")
    socket.create_connection((host, int(port)), timeout=5)
print("connected")
"""


def playable(file: str, folder: Path, ordinary_sidecar: bool) -> tuple[Path, str, list[str]]:
    """A copy of the manifest with this run's names and the agent in the sidecar's image;
    with `ordinary_sidecar`, the sidecar is the pod's first container instead of a native
    sidecar. Returns the copy, the pod's name and its volumes' (podman makes a named volume
    of each, the ConfigMap and the emptyDir alike, and keeps them after the pod)."""
    documents = [doc for doc in yaml.safe_load_all((KUBE / file).read_text()) if doc]
    for doc in documents:
        doc["metadata"]["name"] = f"t{RUN_ID}-{doc['metadata']['name']}"
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    agent_spec(spec)["image"] = image()
    sidecar_spec(spec)["image"] = image()
    renamed = {volume["name"]: f"t{RUN_ID}-{volume['name']}" for volume in spec["volumes"]}
    for volume in spec["volumes"]:
        volume["name"] = renamed[volume["name"]]
        if "configMap" in volume:  # podman names the ConfigMap's volume after the ConfigMap
            volume["configMap"]["name"] = f"t{RUN_ID}-{volume['configMap']['name']}"
            renamed[volume["configMap"]["name"]] = volume["configMap"]["name"]
    for container in spec["containers"] + spec.get("initContainers", []):
        for mount in container.get("volumeMounts", []):
            mount["name"] = renamed[mount["name"]]
    if ordinary_sidecar:
        sidecar = spec.pop("initContainers")[0]
        del sidecar["restartPolicy"]
        spec["containers"].insert(0, sidecar)
    copy = folder / f"{'ordinary' if ordinary_sidecar else 'native'}-{file}"
    copy.write_text(yaml.safe_dump_all(documents))
    return copy, f"{deployment['metadata']['name']}-pod-0", list(renamed.values())


def play(copy: Path, pod: str, volumes: list[str], made: Cleanup) -> Any:
    made.pods.append(pod)
    made.volumes += volumes
    (configmap_doc,) = yaml.safe_load_all((KUBE / "configmap.yaml").read_text())
    configmap_doc["metadata"]["name"] = f"t{RUN_ID}-{configmap_doc['metadata']['name']}"
    configmap = copy.with_name(f"configmap-{copy.name}")
    configmap.write_text(yaml.safe_dump(configmap_doc))
    return podman("kube", "play", "--configmap", str(configmap), str(copy), check=False)


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_kube_play_of_the_manifest(manifest: str, made: Cleanup, tmp_path: Path) -> None:
    copy, pod, volumes = playable(manifest, tmp_path, ordinary_sidecar=False)
    played = play(copy, pod, volumes, made)
    if played.returncode != 0:
        assert NATIVE_SIDECAR_REFUSED in played.stderr, played.stderr
        podman("pod", "rm", "--force", "--time", "0", pod, check=False)
        copy, pod, volumes = playable(manifest, tmp_path, ordinary_sidecar=True)
        played = play(copy, pod, volumes, made)
        assert played.returncode == 0, played.stderr
    check_played_pod(manifest, pod)


def check_played_pod(manifest: str, pod: str) -> None:
    """The played pod is what the manifest describes: the sidecar serves as uid 10001 on a
    read-only root with no capabilities, from the ConfigMap's file, and the agent reaches it
    at its DSP_ADDRESS."""
    spec = pod_spec(manifest)
    sidecar = Container(f"{pod}-dsh-system-prompt")
    listen = env_of(sidecar_spec(spec))["DSP_LISTEN"]
    local = listen.replace("0.0.0.0", "127.0.0.1")
    sidecar.wait_serving(local)
    status = sidecar.proc_status()
    assert status["Uid"].split()[0] == "10001" and int(status["CapEff"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    assert "Read-only file system" in sidecar.exec("touch", "/opt/venv/written").stderr
    mounted = sidecar.exec("cat", "/etc/dsh-system-prompt/sidecar.toml").stdout
    assert mounted == config_files()["sidecar.toml"]
    agent = Container(f"{pod}-agent")
    eventually(lambda: True if agent.running() else None, 30, "the agent running")
    connected = agent.exec("python", "-c", CONNECTS)
    assert connected.stdout.strip() == "connected", connected.stderr
