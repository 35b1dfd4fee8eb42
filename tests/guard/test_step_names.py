"""A watch shows what a listing shows the same credential (Kubernetes RBAC): the waterfall
steps that run for a scope's assemblies are in both, and a step held in the global layer
or in a scope the credential does not list is in both without its name, ref or
fingerprint (docs/operations.md, "Trust model"). Before, an agent watching its own
scope's chain was sent the name of a global listener registered in another scope, which
its listing of the same chain did not show at all."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp
from client.test_local_cache_reach import ADMIN, AGENT, guarded  # noqa: F401 (a fixture)
from dsh_system_prompt_server import Sidecar
from helpers import eventually

STEPS = ("listener", "rule")
Seen = tuple[str, str, str | None]  # kind, name, scope


async def passes(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
) -> dsp.PromptAssembly:
    return await next(assembly)


async def watched_and_listed(sidecar: Sidecar, token: str) -> tuple[list[Seen], list[Seen], bool]:
    """What `token`'s watch and listing of alice's chain show of the steps the admin
    registers: one on team, a global one in bob's scope, a rule in the global layer; and
    whether the events and rows of the two global ones, and only theirs, said `global`."""
    async with (
        dsp.connect(sidecar.address, token=ADMIN) as admin,
        dsp.connect(sidecar.address, token=token) as watcher,
    ):
        team = await admin.scope("team")
        await admin.scope("alice", parent="team")
        bob = await admin.scope("bob")
        events: list[dsp.ChangeEvent] = []
        stream = await watcher.watch_changes("alice", ancestors=True, kinds=STEPS)

        async def follow() -> None:
            async for item in stream:
                if isinstance(item, dsp.ChangeEvent):
                    events.append(item)

        task = asyncio.create_task(follow())
        try:
            await team.on_assemble(passes, name="team-step")
            await bob.on_assemble(passes, global_=True, name="bobs-secret-listener")
            await admin.rule("admins-secret-rule", dsp.Rule([dsp.Mutation.drop_tools("false")]))
            await eventually(lambda: len(events) == 3, "the three steps' events")
        finally:
            task.cancel()
            await stream.close()
        listing = await watcher.snapshot("alice", ancestors=True, kinds=STEPS)
    steps = [*events, *listing.registrations]
    said = all(step.global_ == (step.name != "team-step") for step in steps)
    watched = sorted((e.kind, e.name, e.scope) for e in events)
    listed = sorted((r.kind, r.name, r.scope) for r in listing.registrations)
    return watched, listed, said


async def test_an_agent_sees_steps_held_outside_its_scopes_without_their_names(
    guarded: Sidecar,  # noqa: F811 (the fixture imported above)
) -> None:
    watched, listed, said = await watched_and_listed(guarded, AGENT)
    shown = [("listener", "", None), ("listener", "team-step", "team"), ("rule", "", None)]
    assert watched == shown
    assert listed == shown
    assert said


async def test_an_admin_sees_every_step_of_the_chain_by_name(
    guarded: Sidecar,  # noqa: F811 (the fixture imported above)
) -> None:
    watched, listed, said = await watched_and_listed(guarded, ADMIN)
    shown = [
        ("listener", "bobs-secret-listener", "bob"),
        ("listener", "team-step", "team"),
        ("rule", "admins-secret-rule", None),
    ]
    assert watched == shown
    assert listed == shown
    assert said


async def prompt_watch_steps(sidecar: Sidecar, token: str) -> list[Seen]:
    """The steps `token`'s prompt watch of alice's scope is told of, among the changes that led
    to its prompt: the admin's global listener held in bob's scope and its rule in the
    global layer, then a section in alice's scope (the last change it waits for)."""
    async with (
        dsp.connect(sidecar.address, token=ADMIN) as admin,
        dsp.connect(sidecar.address, token=token) as watcher,
    ):
        await admin.scope("team")
        alice = await admin.scope("alice", parent="team")
        bob = await admin.scope("bob")
        prompts = await watcher.watch_prompt("alice")
        try:
            await anext(prompts)  # the prompt as it was: the watch is open
            await bob.on_assemble(passes, global_=True, name="bobs-secret-listener")
            await admin.rule("admins-secret-rule", dsp.Rule([dsp.Mutation.drop_tools("false")]))
            await alice.section("last", 10, "alice's")
            changes: list[dsp.ChangeEvent] = []
            while not any(change.kind == "section" for change in changes):
                changes += (await asyncio.wait_for(anext(prompts), 10)).changes
        finally:
            await prompts.close()
    return sorted((c.kind, c.name + c.ref, c.scope) for c in changes if c.kind in STEPS)


async def test_a_prompt_watch_tells_an_agent_of_steps_outside_its_scopes_without_names(
    guarded: Sidecar,  # noqa: F811 (the fixture imported above)
) -> None:
    assert await prompt_watch_steps(guarded, AGENT) == [("listener", "", None), ("rule", "", None)]
    named = await prompt_watch_steps(guarded, ADMIN)
    assert [(kind, scope) for kind, _, scope in named] == [("listener", "bob"), ("rule", None)]
    assert named[0][1].startswith("bobs-secret-listener")
