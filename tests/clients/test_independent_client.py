"""A Node.js client written from the proto and docs/ alone works against the real sidecar.

`tests/independent_client/client.mjs` was written without reading any client's
code (issue 12): these tests keep it passing, so the documented protocol stays
enough to build a client. Each test runs it against a fresh sidecar and checks
one part of what it printed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from dsh_system_prompt_server import Sidecar
from helpers import IDENTITY, SidecarFactory
from processes import run

CLIENT = Path(__file__).resolve().parents[1] / "independent_client" / "client.mjs"
RUN_TIMEOUT_S = 30.0


async def run_client(address: str, *scenario: str) -> dict[str, Any]:
    """Run the Node client against `address` (a `scenario` of it); its one JSON line."""
    node = shutil.which("node")
    assert node, "node is not on PATH (the independent client needs Node.js 18 or newer)"
    assert (CLIENT.parent / "node_modules").is_dir(), "run `make independent-client-deps` first"
    code, stdout, stderr = await run(node, str(CLIENT), address, *scenario, timeout=RUN_TIMEOUT_S)
    lines = stdout.strip().splitlines()
    assert lines, f"the client printed nothing; stderr: {stderr}"
    results: dict[str, Any] = json.loads(lines[-1])
    assert results["ok"], f"the client failed: {results}"
    assert code == 0, stderr
    return results


def reason(code: str, reason: str) -> dict[str, str]:
    """The part of a failure that both ErrorInfo and the trailer must agree on."""
    return {
        "code": code,
        "reason": reason,
        "info_reason": reason,
        "info_domain": "dsh.systemprompt.v1",
        "trailer_reason": reason,
    }


def failure(result: dict[str, Any]) -> dict[str, str]:
    return {
        key: result[key]
        for key in ("code", "reason", "info_reason", "info_domain", "trailer_reason")
    }


async def test_registrations_assemble_and_render(sidecar: Sidecar) -> None:
    results = await run_client(sidecar.address)

    assert results["scoped_prompt"] == "\n\n".join(
        [
            IDENTITY,
            "Agent 1 rules.",  # the scope's section shadows the global "rules"
            "cwd: /work (checked)",  # the dynamic section, answered from the caller's fields
            "Note for deepseek-v4.",
            "Tail listener was here.",
        ]
    )
    assert results["global_prompt"].startswith(f"{IDENTITY}\n\nYou run on deepseek-v4. Be precise.")
    assert results["scoped_context_snapshot"] == (
        "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
        "\n\nModel: deepseek-v4"
    )
    assert results["scoped_tools"] == ["bash", "todo_write"]
    assert results["scoped_variables"] == [["model", "deepseek-v4"]]
    assert results["provide_requests"][0]["calls"] == [["cwd-text", "PROVIDER_KIND_SECTION"]]


async def test_listeners_post_process_and_tail_call(sidecar: Sidecar) -> None:
    results = await run_client(sidecar.address)

    assert results["scoped_sections"] == [
        "harness:identity",
        "deployment:persona",
        "rules",
        "cwd",
        "note",  # handed to next() by the first listener
        "tail",  # added by the second, which tail-called
    ]
    assert results["tail_listener_saw_note"]
    assert "cwd: /work (checked)" in results["scoped_prompt"]  # post-processed after next()


async def test_change_events_follow_registrations_and_disposals(sidecar: Sidecar) -> None:
    results = await run_client(sidecar.address)

    assert results["events_registered"] == [
        ["CHANGE_KIND_VARIABLE", "model", ""],
        ["CHANGE_KIND_SECTION", "rules", ""],
        ["CHANGE_KIND_SECTION", "cwd", ""],
        ["CHANGE_KIND_CONTEXT", "clock", ""],
        ["CHANGE_KIND_TOOLS", "builtin-tools", ""],
        ["CHANGE_KIND_SCOPE", "agent-1", "agent-1"],
        ["CHANGE_KIND_SECTION", "rules", "agent-1"],
        ["CHANGE_KIND_LISTENER", "post-processor", ""],
        ["CHANGE_KIND_LISTENER", "tail-caller", ""],
    ]
    assert results["events_in_order"]
    assert results["variable_event_revision"] == results["variable_revision"]
    # The session's end disposes everything it held, newest first.
    assert results["unregistered_after_close"] == list(reversed(results["events_registered"]))


async def test_errors_carry_their_reason(sidecar: Sidecar) -> None:
    results = await run_client(sidecar.address)

    assert failure(results["duplicate_name"]) == reason("ALREADY_EXISTS", "DUPLICATE_NAME")
    assert failure(results["bad_variable_name"]) == reason(
        "INVALID_ARGUMENT", "INVALID_VARIABLE_NAME"
    )
    assert failure(results["render_failure"]) == reason("FAILED_PRECONDITION", "RENDER_FAILED")
    assert results["render_failure"]["message"] == (
        'unknown prompt variable "{{nope}}" in section "oops"; registered variables: model'
    )
    assert results["broken_scope_disposed"]


async def test_half_close_disposes_everything_before_ok(sidecar: Sidecar) -> None:
    results = await run_client(sidecar.address)

    assert results["session_end_status"] == "OK"
    assert results["listener_end_statuses"] == ["OK", "OK"]
    assert results["after_close_sections"] == ["harness:identity", "deployment:persona"]
    assert results["after_close_tools"] == []
    assert results["after_close_variables"] == []
    assert results["after_close_contexts"] == []
    assert results["after_close_prompt"] == IDENTITY
    assert failure(results["old_session_refused"]) == reason(
        "FAILED_PRECONDITION", "UNKNOWN_SESSION"
    )


async def test_a_listener_that_never_answers_is_ejected_as_the_docs_say(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    results = await run_client(sidecar.address, "ejection")
    assert failure(results["first"]) == reason("DEADLINE_EXCEEDED", "LISTENER_TIMEOUT")
    assert results["ejected"]["reason"] == "LISTENER_TIMEOUT"
    assert results["ejected"]["message"] == 'listener "silent" did not answer within 0.5s'
    assert results["ejected_the_listener"]
    assert results["told"][-1] == "ejected"
    assert results["listener_end_status"] == "OK"
    assert results["second_sections"] == ["harness:identity", "deployment:persona"]


async def test_a_listener_under_ignore_that_fails_is_skipped_and_named(sidecar: Sidecar) -> None:
    results = await run_client(sidecar.address, "ignore")
    ref = results["weather_ref"]
    assert results["sections"] == ["harness:identity", "deployment:persona", "signature"]
    assert results["weather_invoked"] == 1
    assert results["skipped"] == [
        {
            "kind": "CHANGE_KIND_LISTENER",
            "name": "weather",
            "scope": "",
            "ref": ref,
            "reason": "LISTENER_FAILED",
            "message": 'listener "weather" failed: no weather today',
        }
    ]
    assert results["trailer"] == f"listener:{ref}:LISTENER_FAILED"
