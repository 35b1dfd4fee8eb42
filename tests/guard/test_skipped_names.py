"""An assembly's `skipped` names only the steps its caller's credential is shown by name, as
its watches and listings do (docs/operations.md, "Trust model"): a listener or rule held in
the global layer or in a scope the credential does not list is named there without its
name, ref, or a message naming it or its owner. Before, a scoped agent or reader assembling
its own scope was told the name, ref and error of a global listener held in another scope,
and the name and owner of a step in a parent scope it does not list."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, credentialed, raw_channel, raw_stub

TOKENS = {
    "admin": "skipped-admin-token-0",
    "alice": "skipped-alice-token-1",
    "carol": "skipped-carol-token-2",
    "dash": "skipped-dash-token-3",
}
CREDENTIALS = [
    {"name": "alice", "role": "agent", "scopes": ["team", "alice"]},
    {"name": "carol", "role": "agent", "scopes": ["carol"]},
    {"name": "dash", "role": "reader", "scopes": ["carol"], "values": True},
]
SECRETS = ("admins-secret-listener", "secret failure text", "alices-listener", "alice")
Step = tuple[str, str, str, str, bool]  # kind, name, scope ("": global), reason, has a ref


@pytest.fixture
async def sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    return await credentialed(make_sidecar, tmp_path, TOKENS, CREDENTIALS)


async def fails(assembly: Any, context: Any, next_: dsp.Next) -> Any:
    raise RuntimeError("secret failure text")


async def passes(assembly: Any, context: Any, next_: dsp.Next) -> Any:
    return await next_()


@contextlib.asynccontextmanager
async def steps(sidecar: Sidecar) -> AsyncIterator[None]:
    """carol's scope under `team`; a global listener of the admin's, held in `bob` and
    failing under IGNORE; a listener of alice's in `team`, out of carol's reach."""
    async with (
        dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin,
        dsp.connect(sidecar.address, token=TOKENS["alice"]) as alice,
    ):
        await admin.scope("team")
        await admin.scope("carol", parent="team")
        bob = await admin.scope("bob")
        ignore = dsp.FailurePolicy.IGNORE
        await bob.on_assemble(fails, global_=True, name=SECRETS[0], failure_policy=ignore)
        await (await alice.scope("team")).on_assemble(passes, name="alices-listener")
        yield


async def skipped_of(sidecar: Sidecar, who: str) -> tuple[list[Step], list[str], str]:
    """What `who` is told of carol's assembly: its skipped steps, their messages, and the
    response's `dsh-skipped-steps` trailer."""
    metadata = (("authorization", f"Bearer {TOKENS[who]}"),)
    request = pb.AssembleRequest(context=pb.AssembleContext(scope="carol"))
    async with raw_channel(sidecar.address) as channel:
        call = raw_stub(channel).Assemble(request, metadata=metadata)
        response = await call
        trailer = dict(await call.trailing_metadata() or ())["dsh-skipped-steps"]
    kinds = {pb.CHANGE_KIND_LISTENER: "listener", pb.CHANGE_KIND_RULE: "rule"}
    shown = [(kinds[s.kind], s.name, s.scope, s.reason, bool(s.ref)) for s in response.skipped]
    return sorted(shown), [s.message for s in response.skipped], trailer


@pytest.mark.parametrize("who", ["carol", "dash"])  # an agent, a reader granted values
async def test_a_scoped_caller_is_told_of_steps_outside_its_scopes_without_their_names(
    sidecar: Sidecar, who: str
) -> None:
    async with steps(sidecar):
        shown, messages, trailer = await skipped_of(sidecar, who)
    assert shown == [
        ("listener", "", "", "LISTENER_FAILED", False),  # runs everywhere: the global layer
        ("listener", "", "team", "OUT_OF_REACH", False),
    ]
    assert not [secret for secret in SECRETS for text in messages if secret in text]
    assert sorted(trailer.split(",")) == ["listener::LISTENER_FAILED", "listener::OUT_OF_REACH"]


async def test_the_admin_is_told_of_every_step_by_name(sidecar: Sidecar) -> None:
    async with steps(sidecar):
        shown, messages, trailer = await skipped_of(sidecar, "admin")
    assert shown == [
        ("listener", "admins-secret-listener", "bob", "LISTENER_FAILED", True),
        ("listener", "alices-listener", "team", "OUT_OF_REACH", True),
    ]
    assert any("secret failure text" in text for text in messages)
    assert any('credential "alice"' in text for text in messages)
    assert "::" not in trailer


@pytest.mark.parametrize("who", ["carol", "dash", "admin"])
async def test_a_step_that_fails_the_assembly_is_named_only_to_who_may_know_it(
    sidecar: Sidecar, who: str
) -> None:
    """The admin's global listener held in bob's scope, under FAIL, fails carol's assembly:
    its error names it (and says its words) only to a credential shown it by name."""
    async with (
        dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin,
        dsp.connect(sidecar.address, token=TOKENS[who]) as caller,
    ):
        await admin.scope("carol")
        await (await admin.scope("bob")).on_assemble(fails, global_=True, name=SECRETS[0])
        with pytest.raises(dsp.SystemPromptError) as raised:
            await caller.assemble("carol")
    assert (raised.value.code, raised.value.reason) == (
        grpc.StatusCode.ABORTED,
        "LISTENER_FAILED",
    )
    if who == "admin":
        assert SECRETS[0] in str(raised.value) and SECRETS[1] in str(raised.value)
    else:
        assert str(raised.value).endswith(
            "a listener (global) held outside this credential's scopes failed (LISTENER_FAILED)"
        )
