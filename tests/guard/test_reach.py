"""Reach: a step (listener, rule) or dynamic provider runs for an assembly only when its
owner's credential may read the assembly's scope; elsewhere it is passed over and named in
`skipped` (OUT_OF_REACH), unless the credential holds `global_listeners`.

alice lists `team` and `alice` and installs a listener, a dynamic provider and a rule in
`team`; bob lists `team`, `bob` and `bob/*`, and his scope `bob` sits under `team`. Without
the rule, alice's steps are handed bob's assemblies (his sections, variables and fields) and
may rewrite them, though she may not assemble `bob` herself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt import Mutation, Rule, RulePart
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, raw_channel, raw_stub, section_names

TOKENS = {
    "admin": "admin-token-reach-0",
    "alice": "alice-token-reach-1",
    "bob": "bob-token-reach-2",
    "pod": "pod-token-reach-3",
}
CREDENTIALS = [
    {"name": "alice", "role": "agent", "scopes": ["team", "alice", "alice/*"], "global": True},
    {"name": "bob", "role": "agent", "scopes": ["team", "bob", "bob/*"]},
    {"name": "pod", "role": "agent", "scopes": ["team"], "global_listeners": True},
]
OUT_OF_REACH = dsp.Reason.OUT_OF_REACH


@dataclass
class Seen:
    """What one owner's callbacks were handed: the scope of each call, and bob's fields."""

    scopes: list[str | None] = field(default_factory=list)
    fields: list[dict[str, Any]] = field(default_factory=list)

    def saw(self, context: dsp.AssembleContext) -> None:
        self.scopes.append(context.scope)
        self.fields.append(dict(context.fields))


def reach_config(folder: Path) -> dict[str, Any]:
    files = {}
    for name, token in TOKENS.items():
        files[name] = folder / f"{name}.token"
        files[name].write_text(token + "\n")
    credentials = [{**entry, "token_file": str(files[entry["name"]])} for entry in CREDENTIALS]
    return {"auth_token_file": str(files["admin"]), "credentials": credentials}


@pytest.fixture
async def sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    return await make_sidecar(**reach_config(tmp_path))


@pytest.fixture
async def bob(sidecar: Sidecar) -> AsyncIterator[dsp.Client]:
    """bob's client, his scope `bob` under `team` holding a section and a variable."""
    async with dsp.connect(sidecar.address, token=TOKENS["bob"]) as client:
        await client.scope("team")
        mine = await client.scope("bob", parent="team")
        await mine.section("bob-private", 5, "bob's private notes: {{pin}}")
        await mine.variable("pin", "4711")
        yield client


async def install_steps(client: dsp.Client, seen: Seen, mark: str) -> None:
    """In `team`: a listener adding `mark`-listener, a provider of `mark`-provider and a
    rule adding `mark`-rule, each recording what it was handed."""
    team = await client.scope("team")

    async def listener(assembly: dsp.PromptAssembly, context: Any, next_: dsp.Next) -> Any:
        seen.saw(context)
        assembly.sections.append(dsp.AssembledSection(f"{mark}-listener", "rewritten"))
        return await next_()

    def provider(context: dsp.AssembleContext) -> str:
        seen.saw(context)
        return "provided"

    await team.on_assemble(listener, name=f"{mark}-listener")
    await team.section(f"{mark}-provider", 30, provider)
    await team.rule(
        f"{mark}-rule", Rule([Mutation.upsert_sections(RulePart(f"{mark}-rule", 40, '"ruled"'))])
    )


@contextlib.asynccontextmanager
async def installed(sidecar: Sidecar, who: str) -> AsyncIterator[tuple[dsp.Client, Seen]]:
    """`who`'s client with its steps installed in `team` (`install_steps`), and what they saw."""
    seen = Seen()
    async with dsp.connect(sidecar.address, token=TOKENS[who]) as client:
        await install_steps(client, seen, who)
        yield client, seen


def passed_over(assembly: dsp.PromptAssembly) -> list[tuple[str, str, str | None, str]]:
    return [(s.kind, s.name, s.scope, s.reason) for s in assembly.skipped]


async def test_a_step_in_a_parent_scope_does_not_run_for_a_child_its_owner_may_not_read(
    sidecar: Sidecar, bob: dsp.Client
) -> None:
    async with installed(sidecar, "alice") as (_, seen):
        assembly = await bob.assemble("bob", fields={"ticket": "bob-secret"})
    names = section_names(assembly)
    assert "bob-private" in names
    assert not {"alice-listener", "alice-provider", "alice-rule"} & set(names)
    assert seen.scopes == [] and seen.fields == []  # never handed bob's assembly or fields
    assert sorted(passed_over(assembly)) == [
        ("listener", "alice-listener", "team", OUT_OF_REACH),
        ("rule", "alice-rule", "team", OUT_OF_REACH),
        ("section", "alice-provider", "team", OUT_OF_REACH),
    ]
    messages = {step.name: step.message for step in assembly.skipped}
    assert messages["alice-listener"] == (
        'listener "alice-listener" in scope "team" was not run: its owner, credential "alice",'
        " may not read this assembly's scope"
    )
    assert messages["alice-provider"].startswith('section provider "alice-provider" in scope')


async def test_the_owners_own_assemblies_run_its_steps_and_others_do_not(
    sidecar: Sidecar, bob: dsp.Client
) -> None:
    async with installed(sidecar, "alice") as (alice, seen):
        await alice.scope("alice", parent="team")
        mine = await alice.assemble("alice", fields={"ticket": "alice-own"})
        team = await alice.assemble("team")
        bobs = await bob.assemble("bob", fields={"ticket": "bob-secret"})
    for assembly in (mine, team):
        assert {"alice-listener", "alice-provider", "alice-rule"} <= set(section_names(assembly))
        assert assembly.skipped == ()
    assert seen.scopes == ["alice", "alice", "team", "team"]  # the provider, then the listener
    assert {"ticket": "bob-secret"} not in seen.fields
    assert len(bobs.skipped) == 3 and "alice-rule" not in section_names(bobs)


async def test_a_credential_with_global_listeners_reaches_every_scope(
    sidecar: Sidecar, bob: dsp.Client
) -> None:
    """pod lists only `team` but holds global_listeners: its steps run for bob's scope,
    alice's beside them do not."""
    async with installed(sidecar, "pod") as (_, pods), installed(sidecar, "alice") as (_, alices):
        assembly = await bob.assemble("bob", fields={"ticket": "for-pod"})
    names = set(section_names(assembly))
    assert {"pod-listener", "pod-provider", "pod-rule"} <= names
    assert not {"alice-listener", "alice-provider", "alice-rule"} & names
    assert {step.name for step in assembly.skipped} == {
        "alice-listener",
        "alice-provider",
        "alice-rule",
    }
    assert pods.scopes == ["bob", "bob"] and alices.scopes == []


async def test_a_global_provider_is_not_asked_for_a_key_without_a_layer_out_of_reach(
    sidecar: Sidecar, bob: dsp.Client
) -> None:
    """A key no handle opened shares the global plan: alice's global provider (she may
    write the global layer) is still not asked with bob's context for `bob/new`."""
    seen = Seen()

    def provider(context: dsp.AssembleContext) -> str:
        seen.saw(context)
        return "provided"

    async with dsp.connect(sidecar.address, token=TOKENS["alice"]) as alice:
        await alice.section("alice-global", 30, provider)
        elsewhere = await bob.assemble("bob/new", fields={"ticket": "bob-secret"})
        again = await bob.assemble("bob/other")
        own = await alice.assemble("alice/new")
        plain = await bob.assemble()
    for assembly in (elsewhere, again):
        assert "alice-global" not in section_names(assembly)
        assert passed_over(assembly) == [("section", "alice-global", None, OUT_OF_REACH)]
    for assembly in (own, plain):  # her own keys, and the global scope every one reads
        assert "alice-global" in section_names(assembly) and assembly.skipped == ()
    assert seen.scopes == ["alice/new", None]


async def test_a_static_plan_names_what_it_passed_over_at_every_assembly(
    sidecar: Sidecar, bob: dsp.Client
) -> None:
    """Once alice's steps are out, bob's plan is static (kept whole by the sidecar): each
    assembly of it, not only the first, still says what was passed over, and the answer is
    not `cacheable`: a client's local cache keeps no skipped steps, it would drop the names."""
    request = pb.AssembleRequest(context=pb.AssembleContext(scope="bob"))
    metadata = (("authorization", f"Bearer {TOKENS['bob']}"),)
    async with installed(sidecar, "alice"), raw_channel(sidecar.address) as channel:
        first = await bob.assemble("bob")
        second = await bob.assemble("bob")
        answer = await raw_stub(channel).Assemble(request, metadata=metadata)
    assert len(first.skipped) == len(second.skipped) == 3
    assert first.skipped == second.skipped
    assert len(answer.skipped) == 3 and not answer.cacheable
