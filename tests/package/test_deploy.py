"""The container files: linted, validated, and consistent with each other.

These tests read the Dockerfile and .dockerignore and check what can be checked without a
container engine: the validators pass (scripts/validate-deploy.sh), every COPY source is in
the build context, the health check uses `dsh-system-prompt health`, and the port, user and
entry point agree; the entry point script runs for real against the installed command. The
Kubernetes manifests are test_manifests.py's; the image itself, built and run, tests/image/.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from deploy_files import (
    ENTRYPOINT_SCRIPT,
    HEALTH,
    ROOT,
    SIDECAR,
    STARTUP_S,
    bin_path,
    configmap_toml,
    copies,
    deployments,
    env,
    health_timeout,
    only,
    pod,
    read_line,
    stages,
    start,
    stop,
    words,
)
from processes import free_port, sidecar_command

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
    for name in (".venv/bin/python", ".git/config", "tests/package/test_deploy.py", "bench/x.py"):
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
    """Distroless: the runtime stage starts from nothing and takes the layers the build stage
    cut (deploy/docker/rootfs.py), the final stage adds the project's; nothing else comes in
    and nothing runs there (there is no package manager to run)."""
    build, runtime, final = stages()
    assert words(runtime[0][1]) == ["scratch", "AS", "runtime"], runtime[0]
    assert words(final[0][1]) == ["runtime"], "the final stage must build on the runtime stage"
    layers = []
    for stage in (runtime, final):
        assert not [rest for keyword, rest in stage if keyword == "RUN"], "a RUN in the image"
        for flags, sources, destination in copies(stage):
            assert flags.get("from") == "build", f"{sources} copied from the context"
            (source,) = sources
            if source.startswith("/rootfs/"):
                assert destination == "/", f"{source} is a root filesystem's layer"
                layers.append(source.strip("/").removeprefix("rootfs/"))
            else:
                assert source == destination, "copy runtime files to the same path"
    assert layers == ["system", "dependencies", "project"], layers
    assert any("rootfs.py /opt/venv /rootfs" in rest for keyword, rest in build if keyword == "RUN")
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
