"""Change events of sessions: every registration and disposal an event, revisions that only
grow, a closing session's events."""

from __future__ import annotations

from helpers import ONE_OF_EACH_KINDS, ClientFactory, next_events, one_of_each

# -- change events -------------------------------------------------------------------


async def test_every_registration_emits_a_registered_change_event(
    connect: ClientFactory,
) -> None:
    watcher, owner = await connect(), await connect()
    changes = await watcher.watch_changes()

    await one_of_each(owner, owner)
    scope = await owner.scope("agent-1")
    await scope.section("scoped", 10, "w")

    events = await next_events(changes, 8)

    assert [(e.kind, e.action) for e in events] == [
        (kind, "registered") for kind in (*ONE_OF_EACH_KINDS, "scope", "section")
    ]
    assert [(e.name, e.scope) for e in events[:2]] == [("rules", None), ("cwd", None)]
    assert (events[3].name, events[3].scope) == ("model", None)
    assert "agent-1" in (events[6].name, events[6].scope)
    assert (events[7].name, events[7].scope) == ("scoped", "agent-1")


async def test_change_event_revisions_only_grow(connect: ClientFactory) -> None:
    watcher, owner = await connect(), await connect()
    changes = await watcher.watch_changes()
    off = await owner.section("s", 10, "x")
    await owner.variable("v", "y")
    await off()

    events = await next_events(changes, 3)

    revisions = [event.revision for event in events]
    assert revisions == sorted(set(revisions))
    assert revisions[0] > changes.revision


async def test_every_disposal_emits_an_unregistered_change_event(
    connect: ClientFactory,
) -> None:
    watcher, owner = await connect(), await connect()
    offs = await one_of_each(owner, owner)
    scope = await owner.scope("agent-1")
    changes = await watcher.watch_changes()

    for off in offs:
        await off()
    await scope.dispose()

    events = await next_events(changes, 7)
    assert [(e.kind, e.action) for e in events] == [
        (kind, "unregistered") for kind in (*ONE_OF_EACH_KINDS, "scope")
    ]
    assert (events[0].name, events[3].name) == ("rules", "model")


async def test_closing_a_client_emits_an_unregistered_event_for_each_of_its_registrations(
    connect: ClientFactory,
) -> None:
    watcher, owner = await connect(), await connect()
    await one_of_each(owner, owner)
    scope = await owner.scope("agent-1")
    await scope.section("scoped", 10, "w")
    changes = await watcher.watch_changes()

    await owner.close()

    events = await next_events(changes, 8)
    assert {e.action for e in events} == {"unregistered"}
    assert sorted(e.kind for e in events) == sorted([*ONE_OF_EACH_KINDS, "scope", "section"])
    named = sorted((e.kind, e.name, e.scope) for e in events if e.kind in ("section", "variable"))
    assert named == [
        ("section", "rules", None),
        ("section", "scoped", "agent-1"),
        ("variable", "model", None),
    ]
