"""The registry on its own, in plain Python: plans, scopes, shadowing, disposal, revisions.

No gRPC here: these drive `Registry` through its public methods, as the service does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from dsh_system_prompt_server.registry import (
    AssembleContext,
    Assembly,
    ChangeEvent,
    Dynamic,
    Exchange,
    ProvidedValue,
    Registry,
    RegistryError,
    Subscription,
)

ALICE, BOB = "session-alice", "session-bob"


@dataclass(eq=False)  # hashable by identity, as hosts are keyed
class AnsweringHost:
    """A provider host (the part a client session plays) that records what it is asked."""

    asked: list[str] = field(default_factory=list)

    async def provide(self, exchange: Exchange) -> Mapping[str, ProvidedValue]:
        self.asked.extend(call.key for call in exchange.calls)
        return {call.key: f"provided {call.key}" for call in exchange.calls}


def sections(assembly: Assembly) -> dict[str, str]:
    """The assembly's sections after the built-in identity and persona."""
    return {part.name: part.text for part in assembly.sections[2:]}


async def scoped(registry: Registry, scope: str | None = None) -> dict[str, str]:
    return sections(await registry.assemble(AssembleContext(scope=scope)))


async def published(registry: Registry, subscription: Subscription) -> list[ChangeEvent]:
    """Every event `subscription` has been sent, up to the registry's revision now."""
    events: list[ChangeEvent] = []
    reached = subscription.revision
    while reached < registry.revision:
        event = await subscription.next()
        assert isinstance(event, ChangeEvent), event
        events.append(event)
        reached = event.revision
    return events


# -- plans ----------------------------------------------------------------------------


def test_a_plan_is_reused_until_a_change() -> None:
    registry = Registry()
    registry.register_section(ALICE, None, "rules", 1, "r")
    plan = registry.plan(None)
    assert registry.plan(None) is plan
    registry.open_scope(ALICE, "agent")
    assert registry.plan("agent") is not plan  # one per scope


def test_a_scope_key_no_handle_opened_gets_the_global_plan() -> None:
    registry = Registry()
    assert registry.plan("never-opened") is registry.plan(None)


async def test_a_registration_replaces_the_plan_and_shows_in_the_next_assembly() -> None:
    registry = Registry()
    before = registry.plan(None)
    assert await scoped(registry) == {}
    registry.register_section(ALICE, None, "rules", 1, "r")
    assert registry.plan(None) is not before
    assert await scoped(registry) == {"rules": "r"}


async def test_a_disposal_replaces_the_plan_and_goes_from_the_next_assembly() -> None:
    registry = Registry()
    entry = registry.register_section(ALICE, None, "rules", 1, "r")
    assert await scoped(registry) == {"rules": "r"}
    before = registry.plan(None)
    registry.dispose(ALICE, entry.id)
    assert registry.plan(None) is not before
    assert await scoped(registry) == {}


# -- scopes ---------------------------------------------------------------------------


async def test_a_scope_whose_last_registration_goes_assembles_as_global() -> None:
    registry = Registry()
    registry.register_section(BOB, None, "rules", 1, "global")
    handle = registry.open_scope(ALICE, "agent")
    scoped_rules = registry.register_section(ALICE, handle.id, "rules", 1, "scoped")
    extra = registry.register_section(ALICE, handle.id, "extra", 2, "scoped")
    assert await scoped(registry, "agent") == {"rules": "scoped", "extra": "scoped"}
    registry.dispose(ALICE, scoped_rules.id)
    assert await scoped(registry, "agent") == {"rules": "global", "extra": "scoped"}
    registry.dispose(ALICE, extra.id)  # the handle stays open; the layer has nothing left
    assert await scoped(registry, "agent") == await scoped(registry) == {"rules": "global"}


def test_a_scope_is_forgotten_with_its_last_handle_and_its_parent_with_its_last_child() -> None:
    registry = Registry()
    team = registry.open_scope(ALICE, "team")
    first = registry.open_scope(ALICE, "agent", parent="team")
    second = registry.open_scope(BOB, "agent")
    registry.dispose(ALICE, team.id)
    registry.dispose(ALICE, first.id)
    # Bob's handle still holds "agent", and "agent"'s binding holds "team".
    assert sorted(registry.scope_keys()) == ["agent", "team"]
    assert registry.plan("agent").chain == ["agent", "team"]
    registry.dispose(BOB, second.id)
    assert registry.scope_keys() == []
    registry.open_scope(BOB, "agent", parent="other-team")  # the old binding went too
    assert registry.plan("agent").chain == ["agent", "other-team"]


async def test_a_scope_handles_registrations_go_with_it() -> None:
    registry = Registry()
    handle = registry.open_scope(ALICE, "agent")
    registry.register_section(ALICE, handle.id, "scoped", 1, "s")
    registry.register_section(ALICE, None, "global", 1, "g")
    registry.dispose(ALICE, handle.id)
    assert [entry.name for entry in registry.registrations(ALICE)] == ["global"]
    assert await scoped(registry, "agent") == {"global": "g"}


# -- shadowing ------------------------------------------------------------------------


async def test_the_nearest_scope_wins() -> None:
    registry = Registry()
    team = registry.open_scope(ALICE, "team")
    agent = registry.open_scope(ALICE, "agent", parent="team")
    for handle, text in ((None, "global"), (team.id, "team"), (agent.id, "agent")):
        registry.register_section(ALICE, handle, "rules", 1, text)
        registry.register_variable(ALICE, handle, "model", text)
    for scope, text in ((None, "global"), ("team", "team"), ("agent", "agent")):
        assembly = await registry.assemble(AssembleContext(scope=scope))
        assert (sections(assembly), assembly.variables) == ({"rules": text}, {"model": text})


async def test_a_shadowed_dynamic_provider_is_never_asked() -> None:
    registry = Registry()
    host = AnsweringHost()
    registry.register_section(ALICE, None, "rules", 1, Dynamic(host, "rules"))
    registry.register_variable(ALICE, None, "model", Dynamic(host, "model"))
    agent = registry.open_scope(BOB, "agent")
    registry.register_section(BOB, agent.id, "rules", 1, "static")
    registry.register_variable(BOB, agent.id, "model", "static")
    assembly = await registry.assemble(AssembleContext(scope="agent"))
    assert (sections(assembly), assembly.variables) == ({"rules": "static"}, {"model": "static"})
    assert host.asked == []
    assert await scoped(registry) == {"rules": "provided rules"}  # unshadowed it is asked
    assert sorted(host.asked) == ["model", "rules"]


# -- disposal -------------------------------------------------------------------------


async def test_dispose_owner_removes_newest_first_and_only_that_owner() -> None:
    registry = Registry()
    registry.register_section(ALICE, None, "a", 1, "a")
    registry.register_context(ALICE, None, "b", 1, "b")
    handle = registry.open_scope(ALICE, "agent")
    registry.register_variable(ALICE, handle.id, "c", "c")
    kept = registry.register_section(BOB, None, "bob", 2, "bob")
    subscription = registry.changes.subscribe(capacity=16)
    assert registry.dispose_owner(ALICE) == 4
    gone = [(e.kind.value, e.name) for e in await published(registry, subscription)]
    assert gone == [("variable", "c"), ("scope", "agent"), ("context", "b"), ("section", "a")]
    assert registry.registrations(ALICE) == []
    assert kept in registry.registrations(BOB)


def test_only_the_owner_may_dispose_a_registration() -> None:
    registry = Registry()
    entry = registry.register_section(ALICE, None, "rules", 1, "r")
    with pytest.raises(RegistryError) as refused:
        registry.dispose(BOB, entry.id)
    assert refused.value.reason == "REGISTRATION_NOT_FOUND"
    assert entry in registry.registrations(ALICE)


# -- revisions ------------------------------------------------------------------------


async def test_each_registration_and_disposal_is_one_revision_in_order() -> None:
    registry = Registry()
    start = registry.revision
    subscription = registry.changes.subscribe(capacity=16)
    handle = registry.open_scope(ALICE, "agent")
    section = registry.register_section(ALICE, handle.id, "rules", 1, "r")
    registry.dispose(ALICE, section.id)
    events = await published(registry, subscription)
    assert [(e.revision, e.kind.value, e.action.value, e.name, e.scope) for e in events] == [
        (start + 1, "scope", "registered", "agent", "agent"),
        (start + 2, "section", "registered", "rules", "agent"),
        (start + 3, "section", "unregistered", "rules", "agent"),
    ]
    assert registry.revision == start + 3


def test_a_rejected_registration_changes_nothing() -> None:
    registry = Registry()
    registry.register_section(ALICE, None, "rules", 1, "r")
    revision, plan = registry.revision, registry.plan(None)
    with pytest.raises(RegistryError) as refused:
        registry.register_section(BOB, None, "rules", 2, "again")
    assert refused.value.reason == "DUPLICATE_NAME"
    assert registry.revision == revision
    assert registry.plan(None) is plan
    assert registry.registrations(BOB) == []
