"""The container and Kubernetes files: linted, validated, and consistent with each other.

No container engine or cluster runs here, so these tests read the Dockerfile, .dockerignore
and deploy/kubernetes/ and check what can be checked without one: the validators pass
(scripts/validate-deploy.sh), every COPY source is in the build context, the health check
and probes use `dsh-system-prompt health`, and the port, addresses, user and grace period
agree across the Dockerfile, the ConfigMap and the manifests. The entry point script and
the placeholder agents run for real against the installed command.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dsh_system_prompt_server import parse_config
from processes import free_port, sidecar_command

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


# --- reading .dockerignore (Docker's rules: last match wins, '!' re-includes, and a
# pattern that matches a folder matches everything under it) -----------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        negated = text.startswith("!")
        rules.append((negated, _glob_regex(text.lstrip("!").strip("/"))))
    return rules


def ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in rules:
        if any(regex.fullmatch(candidate) for candidate in candidates):
            excluded = not negated
    return excluded


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


@pytest.fixture
def sidecar_on() -> Iterator[Any]:
    """Start the installed `serve` on an address; stopped after the test."""
    running: list[subprocess.Popen[str]] = []

    def serve_on(listen: str) -> str:
        process = start([sidecar_command(), "serve", "--listen", listen], {})
        running.append(process)
        line = read_line(process)
        assert "listening on" in line, line
        return line.split("listening on", 1)[1].strip()

    yield serve_on
    for process in running:
        stop(process)


# --- the validators ---------------------------------------------------------------------


def test_validate_deploy_passes() -> None:
    """hadolint on the Dockerfile, kubernetes-validate --strict on the manifests."""
    tools = Path(sys.executable).parent
    missing = [t for t in ("hadolint", "kubernetes-validate") if not (tools / t).exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed beside {sys.executable}: dev extras")
    result = subprocess.run(
        [str(ROOT / "scripts" / "validate-deploy.sh")],
        env={**os.environ, "BIN": str(tools)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hadolint: Dockerfile passed" in result.stdout
    assert result.stdout.count("manifests passed against") >= 1


# --- the Dockerfile ---------------------------------------------------------------------


def test_every_copy_source_exists_and_is_in_the_build_context() -> None:
    rules = dockerignore()
    build, *_ = stages()
    for flags, sources, _ in copies(build):
        assert "from" not in flags
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"COPY {source}: no such file in the repository"
            assert not ignored(source, rules), f"COPY {source}: excluded by .dockerignore"
            inside = [path] if path.is_file() else path.rglob("*")
            for file in inside:
                name = file.relative_to(ROOT).as_posix()
                needed = file.suffix in (".py", ".pyi") or file.name == "py.typed"
                if needed and "__pycache__" not in name:
                    assert not ignored(name, rules), f"{name}: excluded by .dockerignore"


def test_build_context_leaves_out_the_rest() -> None:
    rules = dockerignore()
    for name in (".venv/bin/python", ".git/config", "tests/test_deploy.py", "bench/x.py"):
        assert ignored(name, rules), f"{name} would be sent to the Docker daemon"
    for name in ("client/x/__pycache__/a.pyc", "server/a.egg-info/PKG-INFO"):
        assert ignored(name, rules), name


def test_the_wheel_gets_what_pyproject_names() -> None:
    """setuptools needs pyproject.toml, the readme, and the packages.find folders."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    build, *_ = stages()
    copied = {Path(source).as_posix() for _, sources, _ in copies(build) for source in sources}
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= set(pyproject["tool"]["setuptools"]["packages"]["find"]["where"])
    assert needed <= copied, f"not copied into the build stage: {needed - copied}"


def test_final_stage_holds_only_the_runtime() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2, "the Dockerfile is not multi-stage"
    build, final = all_stages[0], all_stages[-1]
    build_image = words(build[0][1])
    assert words(final[0][1]) == build_image[:1], "both stages must share the base image"
    for flags, sources, destination in copies(final):
        assert flags.get("from") == "build", f"final stage copies {sources} from the context"
        assert sources == [destination], "copy runtime files to the same path"
    assert any("/opt/venv" in sources for _, sources, _ in copies(final))
    values = env(final)
    assert values["PATH"].startswith("/opt/venv/bin:")
    assert values["PYTHONDONTWRITEBYTECODE"] == "1"
    assert values["PYTHONUNBUFFERED"] == "1"


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    final = stages()[-1]
    user, _, group = only(final, "USER").partition(":")
    assert user.isdigit() and int(user) > 0, "USER must be a numeric non-root uid"
    assert not group or (group.isdigit() and int(group) > 0)
    for name in deployments():
        assert pod(name)["securityContext"]["runAsUser"] == int(user)


def test_port_stop_signal_and_healthcheck() -> None:
    final = stages()[-1]
    values = env(final)
    port = int(only(final, "EXPOSE").split("/")[0])
    assert values["DSP_LISTEN"] == f"0.0.0.0:{port}"
    assert values["DSP_HEALTH_ADDRESS"] == f"127.0.0.1:{port}"
    assert only(final, "STOPSIGNAL") == "SIGTERM"
    healthcheck = only(final, "HEALTHCHECK")
    command = words(healthcheck.partition(" CMD ")[2])
    assert command[:2] == ["/bin/sh", "-c"], command
    check = shlex.split(command[2])
    assert check[:4] == [*HEALTH, "$DSP_HEALTH_ADDRESS"]
    docker_timeout = re.search(r"--timeout=(\d+)s", healthcheck)
    assert docker_timeout, "HEALTHCHECK needs a --timeout"
    assert health_timeout(check) < float(docker_timeout[1])


def test_entrypoint_is_the_script_from_the_repository() -> None:
    build, *_, final = stages()
    (entrypoint,) = words(only(final, "ENTRYPOINT"))
    placed = {destination for _, _, destination in copies(final)}
    assert any(Path(d).name == entrypoint for d in placed), f"{entrypoint} is not copied in"
    script = {dest: sources for _, sources, dest in copies(build)}[f"/usr/local/bin/{entrypoint}"]
    assert script == [ENTRYPOINT_SCRIPT.relative_to(ROOT).as_posix()]
    assert words(only(final, "CMD")) == ["serve"]
    subprocess.run(["sh", "-n", str(ENTRYPOINT_SCRIPT)], check=True)


def test_the_command_has_the_subcommands_and_flags_used() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert SIDECAR in pyproject["project"]["scripts"]
    for args, flags in (
        (["serve", "--help"], ["--config", "--listen", "--log-format"]),
        (["health", "--help"], ["--address"]),
    ):
        result = subprocess.run([sidecar_command(), *args], capture_output=True, text=True)
        assert result.returncode == 0, f"{SIDECAR} {' '.join(args)}: {result.stderr}"
        for flag in flags:
            assert flag in result.stdout, f"{SIDECAR} {args[0]} has no {flag}"


# --- the entry point script -------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "environment", "expected"),
    [
        ([], {}, "serve --listen 0.0.0.0:50051"),
        (
            ["serve"],
            {"DSP_LISTEN": "unix:/run/dsp/dsp.sock"},
            "serve --listen unix:/run/dsp/dsp.sock",
        ),
        ([], {"DSP_CONFIG": "/c.toml"}, "serve --listen 0.0.0.0:50051 --config /c.toml"),
        (["--log-format", "json"], {}, "serve --listen 0.0.0.0:50051 --log-format json"),
        (["serve", "--listen", "x:1"], {}, "serve --listen 0.0.0.0:50051 --listen x:1"),
        (
            ["health", "--address", "127.0.0.1:1"],
            {"DSP_CONFIG": "/c"},
            "health --address 127.0.0.1:1",
        ),
    ],
)
def test_entrypoint_arguments(
    tmp_path: Path, args: list[str], environment: dict[str, str], expected: str
) -> None:
    """What the script hands the command (a stand-in that prints its arguments)."""
    fake = tmp_path / SIDECAR
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DSP_")}
    result = subprocess.run(
        ["sh", str(ENTRYPOINT_SCRIPT), *args],
        env={**clean, **environment, "PATH": f"{tmp_path}{os.pathsep}{clean['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == expected


def test_entrypoint_serves_and_drains_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(configmap_toml())
    listen = f"127.0.0.1:{free_port()}"
    process = start(
        ["sh", str(ENTRYPOINT_SCRIPT)],
        {"PATH": bin_path(), "DSP_LISTEN": listen, "DSP_CONFIG": str(config)},
    )
    try:
        assert read_line(process).strip() == f"dsh-system-prompt listening on {listen}"
    finally:
        code = stop(process)
    assert code == 0, "SIGTERM must reach the sidecar (exec) and end in a clean drain"


def test_entrypoint_fails_on_a_missing_config(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    result = subprocess.run(
        ["sh", str(ENTRYPOINT_SCRIPT)],
        env={**os.environ, "PATH": bin_path(), "DSP_CONFIG": str(missing)},
        capture_output=True,
        text=True,
        timeout=STARTUP_S,
    )
    assert result.returncode == 2
    assert str(missing) in result.stderr


def test_image_healthcheck_command_reports_serving(sidecar_on: Any) -> None:
    """The HEALTHCHECK's own command line, run against a real sidecar."""
    address = sidecar_on(f"127.0.0.1:{free_port()}")
    healthcheck = only(stages()[-1], "HEALTHCHECK")
    command = words(healthcheck.partition(" CMD ")[2])
    env_vars = {**os.environ, "PATH": bin_path(), "DSP_HEALTH_ADDRESS": address}
    result = subprocess.run(command, env=env_vars, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    env_vars["DSP_HEALTH_ADDRESS"] = f"127.0.0.1:{free_port()}"  # nobody there
    result = subprocess.run(command, env=env_vars, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, "anything but SERVING must read as unhealthy (1)"


# --- the Kubernetes manifests -----------------------------------------------------------


def test_configmap_is_a_valid_sidecar_config() -> None:
    table = tomllib.loads(configmap_toml())
    config = parse_config(table)
    for key, value in table.items():  # each key is read as written, none dropped
        holder = config.registry if hasattr(config.registry, key) else config
        assert getattr(holder, key) == value, key


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
