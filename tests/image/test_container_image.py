"""The image itself: its HEALTHCHECK, the security context the manifests ask of it, its size.

The HEALTHCHECK is run by the engine (`podman healthcheck run`, which executes the image's
own command with its own timeout), so these tests see what Docker or podman would report.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine import Cleanup, Container, eventually, image, name, podman
from kube import ConfigMapFolder, config_files, create_flags, empty_dir, pod_spec, sidecar_spec

SOCKET = "unix:/run/dsp/dsp.sock"
# What the runtime itself writes into a container: the mount points of the files it binds
# over /etc and the marker it leaves in /run. Anything else in `podman diff` is the image's.
RUNTIME_WRITES = {
    "/etc",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
    "/run",
    "/run/.containerenv",
}
PROJECT_LIMIT_MIB = 64  # what the image may add over its base (issue 23)


def run(made: Cleanup, what: str, *flags: str) -> Container:
    container = Container(name(what))
    podman("run", "--detach", "--name", container.name, *flags, image())
    made.containers.append(container.name)
    return container


def healthy(container: Container) -> bool:
    """The engine's verdict from one run of the image's HEALTHCHECK."""
    result = podman("healthcheck", "run", container.name, check=False, timeout=30)
    assert "no defined healthcheck" not in result.stderr, result.stderr
    return result.returncode == 0


def test_the_healthcheck_reports_healthy_and_a_stopped_sidecar_unhealthy(made: Cleanup) -> None:
    container = run(made, "health")
    container.wait_serving("127.0.0.1:50051")
    assert healthy(container)
    # SIGSTOP freezes the sidecar, PID 1: it neither answers nor exits, as a hung one.
    podman("kill", "--signal", "STOP", container.name)
    assert not healthy(container)
    podman("kill", "--signal", "CONT", container.name)
    assert eventually(lambda: True if healthy(container) else None, 10, "healthy again")


def test_the_healthcheck_follows_the_socket_the_manifest_names(
    made: Cleanup, tmp_path: Path
) -> None:
    """agent-unix-socket.yaml moves DSP_LISTEN and DSP_HEALTH_ADDRESS to the socket."""
    container = run(made, "health-unix", *manifest_flags(made, tmp_path))
    container.wait_serving(SOCKET)
    assert healthy(container)
    assert (
        container.exec(
            "dsh-system-prompt", "health", "--address", "127.0.0.1:50051", "--timeout", "1"
        ).returncode
        != 0
    )


def manifest_flags(made: Cleanup, folder: Path) -> list[str]:
    """The sidecar of agent-unix-socket.yaml as `podman run` flags: its env, its security
    context and limits, the ConfigMap and the socket's emptyDir mounted."""
    spec = pod_spec("agent-unix-socket.yaml")
    config = ConfigMapFolder(folder / "config", config_files())
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    sources = {
        "sidecar-config": str(config.path),
        "dsp-socket": empty_dir(volumes["dsp-socket"], folder / "dsp-socket", made),
    }
    return create_flags(sidecar_spec(spec), spec, sources)


def test_the_manifests_security_context_holds(made: Cleanup, tmp_path: Path) -> None:
    """uid/gid 10001, no capabilities, no privilege gain, and a root it cannot write:
    the sidecar serves like that, its socket in the shared volume."""
    container = run(made, "security", *manifest_flags(made, tmp_path))
    container.wait_serving(SOCKET)
    status = container.proc_status()
    assert status["Uid"].split() == ["10001"] * 4
    assert status["Gid"].split() == ["10001"] * 4
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[capabilities], 16) == 0, (capabilities, status[capabilities])
    assert status["NoNewPrivs"] == "1"
    for path in ("/opt/venv/written", "/tmp/written", "/etc/dsh-system-prompt/written"):
        result = container.exec("touch", path)
        assert result.returncode != 0 and "Read-only file system" in result.stderr, path
    assert container.exec("test", "-S", "/run/dsp/dsp.sock").returncode == 0


def test_the_sidecar_writes_nothing_outside_run_dsp(made: Cleanup, tmp_path: Path) -> None:
    """On a writable root, a whole life (start, serve, assemble, reload, stop) changes
    nothing but /run/dsp: what a read-only root filesystem needs."""
    container = run(made, "writes", "--env", f"DSP_LISTEN={SOCKET}")
    container.wait_serving(SOCKET)
    assembled = container.exec("dsh-system-prompt", "assemble", "--address", SOCKET, "--json")
    assert assembled.returncode == 0, assembled.stderr
    assert json.loads(assembled.stdout)
    podman("kill", "--signal", "HUP", container.name)  # a reload, with no config file
    podman("stop", "--time", "10", container.name)
    assert container.exit_code() == 0
    changed = {
        line.split(maxsplit=1)[1]
        for line in podman("diff", container.name).stdout.split("\n")
        if line
    }
    assert "/run/dsp/dsp.sock" in changed or "/run/dsp" in changed
    outside = {path for path in changed - RUNTIME_WRITES if not path.startswith("/run/dsp")}
    assert not outside, f"written outside /run/dsp: {sorted(outside)}"


def inspect(tag: str, template: str) -> str:
    return podman("image", "inspect", "--format", template, tag).stdout.strip()


def added_over_base(tag: str) -> int:
    """Bytes the image holds beyond its base (the base its LABEL names); the sizes are of
    the layers unpacked, as `podman images` shows them."""
    base = inspect(tag, '{{index .Labels "org.opencontainers.image.base.name"}}')
    assert base, "the image does not name its base"
    base_layers = inspect(base, "{{json .RootFS.Layers}}")
    assert inspect(tag, "{{json .RootFS.Layers}}").startswith(base_layers[:-1]), "not on its base"
    return int(inspect(tag, "{{.Size}}")) - int(inspect(base, "{{.Size}}"))


def test_the_project_adds_at_most_64_mib_over_its_base() -> None:
    """Everything above the base: the user, the venv, the entry point."""
    added = added_over_base(image())
    assert added <= PROJECT_LIMIT_MIB * 2**20, f"{added / 2**20:.1f} MiB over the base"


def test_the_image_carries_no_installer_tests_or_caches(made: Cleanup) -> None:
    found = podman(
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        image(),
        "-c",
        "ls /opt/venv/bin; find /opt/venv -name tests -o -name '*.pyi'"
        " -o -name 'pip*' -o -name setuptools",
    ).stdout.split()
    for unwanted in ("pip", "pip3", "setuptools", "tests"):
        assert not [path for path in found if path.rsplit("/", 1)[-1] == unwanted], found
    assert not [path for path in found if path.endswith(".pyi")], found
