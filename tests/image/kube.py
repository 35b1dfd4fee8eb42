"""deploy/kubernetes/ read as a kubelet reads it, and the same pod built by hand with podman.

podman 4.3 (Debian bookworm's) refuses the manifests' native sidecar in `kube play`
(test_kube_play.py), so these tests build the pod the manifests describe from the manifests
themselves: each container's env, volume mounts, security context and memory/CPU limits
become `podman create` flags, the ConfigMap becomes a folder laid out as the kubelet lays it
out (files behind a `..data` symlink swapped atomically on an edit), an `emptyDir` of
medium Memory becomes a tmpfs on a folder both containers mount, and the sidecar's startup probe
must pass before the agent starts, as it must for a native sidecar.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from engine import ROOT, Cleanup, Container, eventually, image, name, podman

KUBE = ROOT / "deploy" / "kubernetes"
SIDECAR = "dsh-system-prompt"
HOST_CLI = Path(os.environ.get("DSP_HOST_BIN", ROOT / ".venv" / "bin")) / "dsh-system-prompt"


def documents(file: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((KUBE / file).read_text()) if doc]


def pod_spec(file: str) -> dict[str, Any]:
    """The pod template of the file's Deployment."""
    (deployment,) = [doc for doc in documents(file) if doc["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def config_files() -> dict[str, str]:
    """The ConfigMap's data: file name -> text."""
    (configmap,) = documents("configmap.yaml")
    data: dict[str, str] = configmap["data"]
    return data


def sidecar_spec(spec: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == SIDECAR
    ]
    (sidecar,) = found
    return sidecar


def agent_spec(spec: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in spec["containers"] if c["name"] == "agent"]
    (agent,) = found
    return agent


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: str(item["value"]) for item in container.get("env", [])}


class ConfigMapFolder:
    """A ConfigMap volume as the kubelet writes it: `..data` -> a timestamped folder, and
    each key a symlink through `..data`. An update writes a new folder and renames a new
    `..data` over the old one, so a reader sees the old files or the new, never a mix."""

    def __init__(self, path: Path, files: dict[str, str]) -> None:
        self.path = path
        path.mkdir(mode=0o755)
        path.chmod(0o755)  # the container's uid 10001 must be able to read it
        self.generation = 0
        self.update(files)
        for key in files:
            (path / key).symlink_to(Path("..data") / key)

    def update(self, files: dict[str, str]) -> None:
        self.generation += 1
        folder = self.path / f"..2026_01_01_00_00_00.{self.generation:09d}"
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
        for key, text in files.items():
            (folder / key).write_text(text)
            (folder / key).chmod(0o644)
        old = (self.path / "..data").resolve() if (self.path / "..data").exists() else None
        (self.path / "..data_tmp").symlink_to(folder.name)
        os.replace(self.path / "..data_tmp", self.path / "..data")
        if old is not None:
            shutil.rmtree(old)


def security_flags(container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """The pod's and the container's securityContext as podman flags (the container wins)."""
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    flags = []
    if "runAsUser" in context:
        flags += ["--user", f"{context['runAsUser']}:{context.get('runAsGroup', 0)}"]
    if context.get("readOnlyRootFilesystem"):
        # Kubernetes adds no tmpfs of its own to a read-only root; podman would (/tmp, /run).
        flags += ["--read-only", "--read-only-tmpfs=false"]
    for capability in context.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    # seccompProfile RuntimeDefault is what podman applies anyway.
    return flags


def limit_flags(container: dict[str, Any]) -> list[str]:
    limits = container.get("resources", {}).get("limits", {})
    flags = []
    if "memory" in limits:
        flags += ["--memory", f"{mebibytes(str(limits['memory']))}m"]
    if "cpu" in limits:
        cpu = str(limits["cpu"])
        flags += ["--cpus", str(int(cpu[:-1]) / 1000) if cpu.endswith("m") else cpu]
    return flags


def volume_flags(container: dict[str, Any], sources: dict[str, str]) -> list[str]:
    flags = []
    for mount in container.get("volumeMounts", []):
        mode = ":ro" if mount.get("readOnly") else ""
        flags += ["--volume", f"{sources[mount['name']]}:{mount['mountPath']}{mode}"]
    return flags


def create_flags(
    container: dict[str, Any], pod: dict[str, Any], sources: dict[str, str]
) -> list[str]:
    """Everything the manifest says about one container, as `podman create` flags."""
    flags = [f"--env={key}={value}" for key, value in env_of(container).items()]
    return (
        flags
        + security_flags(container, pod)
        + limit_flags(container)
        + volume_flags(container, sources)
    )


def entrypoint(container: dict[str, Any]) -> list[str]:
    """A container's `command`, which replaces the image's ENTRYPOINT; `args` replace CMD."""
    if "command" not in container:
        return []
    return ["--entrypoint", json.dumps(container["command"])]


@dataclass
class Pod:
    """The manifest's pod, built by hand: its sidecar is up (startup probe passed)."""

    file: str
    spec: dict[str, Any]
    pod: str
    sidecar: Container
    config: ConfigMapFolder
    sources: dict[str, str]

    @property
    def sidecar_address(self) -> str:
        return env_of(sidecar_spec(self.spec))["DSP_LISTEN"]

    @property
    def agent_address(self) -> str:
        return env_of(agent_spec(self.spec))["DSP_ADDRESS"]

    def ip(self) -> str:
        infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", self.pod)
        return Container(infra.stdout.strip()).inspect("{{.NetworkSettings.IPAddress}}")

    def probe(self, kind: str = "startupProbe") -> bool:
        """Run one of the sidecar's probes as the kubelet would: an exec probe inside the
        container, a gRPC probe from outside, dialling the pod's IP."""
        probe = sidecar_spec(self.spec)[kind]
        timeout = float(probe.get("timeoutSeconds", 1))
        if "exec" in probe:
            result = self.sidecar.exec(*probe["exec"]["command"], timeout=timeout + 5)
            return result.returncode == 0
        port = probe["grpc"]["port"]
        command = [str(HOST_CLI), "health", "--address", f"{self.ip()}:{port}", "--timeout", "2"]
        return subprocess.run(command, capture_output=True, timeout=timeout + 5).returncode == 0

    def wait_started(self) -> None:
        """The startup probe, every periodSeconds until it passes or failureThreshold."""
        probe = sidecar_spec(self.spec)["startupProbe"]
        seconds = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)
        eventually(lambda: True if self.probe() else None, seconds, f"{self.file} startup")

    def agent_command(
        self, container: str, *command: str, mounts: dict[str, Path] | None = None
    ) -> list[str]:
        """`podman run` of the agent container as the manifest describes it, named
        `container`, running `command` in the sidecar's image (it has Python and the client)."""
        agent = agent_spec(self.spec)
        extra = []
        for target, source in (mounts or {}).items():
            extra += ["--volume", f"{source}:{target}:ro"]
        return [
            "podman",
            "run",
            "--rm",
            "--interactive",
            "--pod",
            self.pod,
            "--name",
            container,
            *create_flags(agent, self.spec, self.sources),
            *extra,
            "--entrypoint",
            command[0],
            image(),
            *command[1:],
        ]

    def restart_sidecar(self) -> None:
        """The container killed (SIGKILL, as an OOM kill would) and started again, its
        emptyDir kept, as the kubelet restarts a sidecar with restartPolicy: Always."""
        podman("kill", "--signal", "KILL", self.sidecar.name)
        eventually(lambda: None if self.sidecar.running() else True, 10, "the kill")
        podman("start", self.sidecar.name)
        self.wait_started()


def build_pod(file: str, folder: Path, made: Cleanup) -> Pod:
    """Create the manifest's pod with its sidecar started and its startup probe passed."""
    spec = pod_spec(file)
    pod = name(file.removesuffix(".yaml"))
    folder.mkdir(parents=True, exist_ok=True)
    podman("pod", "create", "--name", pod)
    made.pods.append(pod)
    config: ConfigMapFolder | None = None
    sources: dict[str, str] = {}
    for volume in spec["volumes"]:
        if "configMap" in volume:
            config = ConfigMapFolder(folder / volume["name"], config_files())
            sources[volume["name"]] = str(config.path)
        elif "emptyDir" in volume:
            sources[volume["name"]] = empty_dir(volume, folder / volume["name"], made)
    assert config is not None, f"{file} mounts no ConfigMap"
    sidecar = sidecar_spec(spec)
    container = Container(f"{pod}-{SIDECAR}")
    podman(
        "create",
        "--pod",
        pod,
        "--name",
        container.name,
        *create_flags(sidecar, spec, sources),
        *entrypoint(sidecar),
        image(),
        *sidecar.get("args", []),
    )
    made.containers.append(container.name)
    podman("start", container.name)
    built = Pod(file, spec, pod, container, config, sources)
    built.wait_started()
    return built


def empty_dir(volume: dict[str, Any], path: Path, made: Cleanup) -> str:
    """An emptyDir as the kubelet makes one: an empty folder on the node, root's and
    world-writable, with a tmpfs of its sizeLimit mounted on it for medium Memory, bound
    into the containers that mount it (and kept when they restart). Not a podman named
    volume: podman gives one the image's /run/dsp, owner and mode included, on first use."""
    path.mkdir()
    path.chmod(0o777)
    options = volume["emptyDir"]
    if options.get("medium") == "Memory":
        size = mebibytes(str(options.get("sizeLimit", "64Mi")))
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size}m,mode=0777", "tmpfs", str(path)]
        subprocess.run(mount, check=True, capture_output=True)
        made.mounts.append(str(path))
    return str(path)


def mebibytes(quantity: str) -> int:
    """A Kubernetes memory quantity in Mi or Gi, in MiB."""
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]
