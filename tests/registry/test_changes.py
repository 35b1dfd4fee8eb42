"""Change events: one per registration and disposal, revisions that only grow."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, SidecarFactory, eventually, next_events, one_of_each


def summary(events: list[dsp.ChangeEvent]) -> list[tuple[str, str, str, str | None]]:
    return [(e.kind, e.action, e.name, e.scope) for e in events]


async def test_every_registration_and_disposal_is_an_event_in_order(client: dsp.Client) -> None:
    changes = await client.watch_changes()
    scope = await client.scope("agent-1")
    offs = await one_of_each(client, scope)
    for off in offs:
        await off()
    await scope.dispose()
    events = await next_events(changes, 14)
    made = [
        ("section", "rules", None),
        ("context", "cwd", None),
        ("tools", "", None),
        ("variable", "model", None),
        ("suppressor", "", "agent-1"),
        ("listener", "untouched", None),
    ]
    assert summary(events) == [
        ("scope", "registered", "agent-1", "agent-1"),
        *[(kind, "registered", name, where) for kind, name, where in made],
        *[(kind, "unregistered", name, where) for kind, name, where in made],
        ("scope", "unregistered", "agent-1", "agent-1"),
    ]
    revisions = [e.revision for e in events]
    assert revisions == list(range(changes.revision + 1, changes.revision + 15))


async def test_subscription_is_in_place_when_watch_changes_returns(
    connect: ClientFactory,
) -> None:
    watcher, other = await connect(), await connect()
    changes = await watcher.watch_changes()
    await other.section("right-after", 1, "x")
    [event] = await next_events(changes, 1)
    assert (event.kind, event.name) == ("section", "right-after")


async def test_scope_events_are_sent_per_handle(connect: ClientFactory) -> None:
    one, two = await connect(), await connect()
    changes = await one.watch_changes()
    await one.scope("shared")
    await two.scope("shared")
    assert summary(await next_events(changes, 2)) == [
        ("scope", "registered", "shared", "shared"),
        ("scope", "registered", "shared", "shared"),
    ]


async def test_a_stuck_watcher_blocks_no_registration_and_is_told_what_it_missed(
    make_sidecar: SidecarFactory,
) -> None:
    # 256 buffered: the stuck watcher overflows; the live reader never does, however loaded
    # the machine, for the changes come 100 at a time, each 100 once it read the 100 before
    # (its write timeout is long for the same reason).
    sidecar: Sidecar = await make_sidecar(
        watch_buffer=256, provider_timeout_s=60, limits={"max_name_bytes": 16384}
    )
    async with dsp.connect(sidecar.address) as client:
        stuck = await client.watch_changes()  # never read until the end
        live = await client.watch_changes()
        live_events: list[dsp.ChangeEvent | dsp.ChangesMissed] = []

        async def read_live() -> None:
            async for event in live:
                live_events.append(event)

        async def read_up_to_now() -> None:
            now = sidecar.registry.revision
            await eventually(
                lambda: bool(live_events) and _reached(live_events[-1]) >= now,
                "the live watcher reads up to the last change",
                timeout=20,
            )

        reader = asyncio.create_task(read_live())
        padding = "x" * 8192  # big events fill the transport's flow-control windows
        offs: list[dsp.Disposer] = []
        for hundred in range(0, 1000, 100):  # 100 registrations at once
            names = [f"s{i}{padding}" for i in range(hundred, hundred + 100)]
            registered = asyncio.gather(*(client.section(name, 1, "") for name in names))
            offs += await asyncio.wait_for(registered, 60)
            await read_up_to_now()
        for index, off in enumerate(offs[:500]):
            await off()
            if index % 100 == 99:
                await read_up_to_now()
        last = sidecar.registry.revision
        reader.cancel()
        assert all(isinstance(e, dsp.ChangeEvent) for e in live_events)
        assert len(live_events) == 1500
        seen: list[dsp.ChangeEvent | dsp.ChangesMissed] = []
        while not seen or _reached(seen[-1]) < last:
            seen.append(await asyncio.wait_for(stuck.__anext__(), 5))
        gaps = [item for item in seen if isinstance(item, dsp.ChangesMissed)]
        assert gaps, "the stuck watcher should have been told it missed events"
        delivered = sum(isinstance(item, dsp.ChangeEvent) for item in seen)
        assert delivered + sum(gap.count for gap in gaps) == 1500


def _reached(item: dsp.ChangeEvent | dsp.ChangesMissed) -> int:
    return item.revision if isinstance(item, dsp.ChangeEvent) else item.resync_revision
