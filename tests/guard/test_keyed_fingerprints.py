"""Keyed fingerprints (issue 34, item 7): what a reader not granted values sees of a value.

A fingerprint is keyed for the sidecar's incarnation (HMAC under a random key made at its
start), so within it equal values print alike and a watcher tells "changed or not", but
a reader cannot test guesses against it (an unkeyed SHA-256 of a 4-digit PIN gave it away
among 10,080 candidates); and a variable's exact size is withheld from a reader not granted
values, in listings and on the admin page. On real sidecars over real sockets.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import dsh_system_prompt as dsp
import grpc.aio
from admin.test_admin_access import fetch
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, next_events

from guard.test_roles import TOKENS, roles_config

PIN = "1234"


async def listed(sidecar: Sidecar, token: str | None = None) -> dict[str, pb.RegistrationInfo]:
    """Every registration a listing shows (its first batch), by name."""
    metadata = None if token is None else (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        call = stub.ListRegistrations(pb.ListRegistrationsRequest(), metadata=metadata)
        batch = await call.read()
        call.cancel()
    return {info.name: info for info in batch.registrations}


def unkeyed(value: str) -> set[str]:
    """What an unkeyed SHA-256 of `value` would print, with or without the value's tag."""
    encoded = value.encode()
    return {hashlib.sha256(data).hexdigest()[:16] for data in (encoded, b"t" + encoded)}


async def test_a_fingerprint_is_no_sha256_of_the_value(sidecar: Sidecar) -> None:
    async with dsp.connect(sidecar.address) as client:
        await client.variable("pin", PIN)
        await client.section("note", 1, "A note.")
        shown = await listed(sidecar)
    assert shown["pin"].fingerprint and shown["note"].fingerprint
    assert shown["pin"].fingerprint not in unkeyed(PIN)
    assert shown["note"].fingerprint not in unkeyed("A note.")


async def test_one_value_prints_alike_in_one_sidecar_and_differently_in_another(
    make_sidecar: SidecarFactory,
) -> None:
    prints = []
    for _ in range(2):
        sidecar = await make_sidecar()
        async with dsp.connect(sidecar.address) as client:
            await client.variable("pin", PIN)
            await client.variable("same_pin", PIN)
            await client.variable("other", "5678")
            shown = await listed(sidecar)
        assert shown["pin"].fingerprint == shown["same_pin"].fingerprint
        assert shown["pin"].fingerprint != shown["other"].fingerprint
        prints.append(shown["pin"].fingerprint)
    assert prints[0] != prints[1]  # each incarnation its own key


async def test_a_change_event_tells_changed_or_not_without_the_values_hash(
    sidecar: Sidecar,
) -> None:
    async with dsp.connect(sidecar.address) as client:
        changes = await client.watch_changes(kinds=["variable"])
        handle = await client.variable("pin", PIN)
        await handle.update("9999")
        await handle.update(PIN)
        events = await next_events(changes, 3)
        await changes.close()
    first, changed, back = (event.fingerprint for event in events)
    assert first == back != changed  # within the incarnation: changed, then back
    assert not {first, changed} & (unkeyed(PIN) | unkeyed("9999"))


async def test_a_reader_without_values_is_not_shown_a_variables_size(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(**roles_config(tmp_path))
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin:
        await admin.variable("pin", PIN)
        await admin.section("note", 1, "A note.")
        dashboard = await listed(sidecar, TOKENS["dashboard"])  # a reader without values
        auditor = await listed(sidecar, TOKENS["auditor"])  # a reader with values
        pod = await listed(sidecar, TOKENS["pod"])  # an agent
    assert dashboard["pin"].size_bytes == 0
    assert dashboard["pin"].fingerprint == auditor["pin"].fingerprint  # still "changed or not"
    assert dashboard["note"].size_bytes == len("A note.")  # a section's size is no secret's
    assert auditor["pin"].size_bytes == pod["pin"].size_bytes == len(PIN)


async def test_the_admin_scope_tree_withholds_a_variables_size(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(admin_listen="127.0.0.1:0", **roles_config(tmp_path))
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin:
        await admin.variable("pin", "a-secret-of-23-bytes!!!")
        await admin.section("note", 1, "A note of 22 bytes....")
        status, _, html = await fetch(sidecar, "/scopes", token=TOKENS["dashboard"])
    assert status == 200
    assert "22 bytes" in html  # the section's size is shown
    assert "23 bytes" not in html
