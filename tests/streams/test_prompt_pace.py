"""Issue 34, "Why" 13: prompt watchers are written at most `prompt_bytes_per_s` together,
and one that waits for its turn still gets the latest prompt with every change since its
last (WatchPrompt coalesces)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar, load_config
from dsh_system_prompt_server.rpc.streams.prompt_pace import PromptPace
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import SidecarFactory, eventually, raw_channel, raw_stub

PART = 40_000
WATCHERS = 8
RATE = 256 * 1024
END_WAIT_S = 10  # a waiter held to the old rate's timer fails the test here, not in 11 days


async def test_prompt_watchers_together_are_written_at_most_prompt_bytes_per_s(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar: Sidecar = await make_sidecar(prompt_bytes_per_s=RATE, prompt_coalesce_s=0)
    written = [0] * WATCHERS  # bytes of the messages each watcher read
    revisions = [0] * WATCHERS  # the revision of each one's latest prompt
    listed = [0] * WATCHERS  # changes listed or counted in its messages after the first
    largest = 0
    async with dsp.connect(sidecar.address) as client, raw_channel(sidecar.address) as channel:
        memory = await client.section("memory", 1, "x" * PART)
        stub = raw_stub(channel)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def read(index: int) -> None:
            nonlocal largest
            async for response in stub.WatchPrompt(pb.WatchPromptRequest()):
                size = response.ByteSize()
                written[index] += size
                largest = max(largest, size)
                revisions[index] = response.revision
                listed[index] += len(response.changes) + response.changes_omitted

        readers = [asyncio.create_task(read(index)) for index in range(WATCHERS)]
        await eventually(lambda: all(revisions), "every watcher's first prompt", timeout=30)
        first = sidecar.registry.revision
        for index in range(60):
            await memory.update(f"{index} " + "x" * PART)
            await asyncio.sleep(0.01)
        last = sidecar.registry.revision
        await eventually(
            lambda: all(revision == last for revision in revisions), "the latest", timeout=60
        )
        elapsed = loop.time() - started
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    # The pace lets a message go once those before it fit the rate since the first: what
    # was written is at most the rate over the time it took, and one message more.
    assert sum(written) <= RATE * elapsed + largest, (sum(written), elapsed)
    # Paced, each watcher still reached the latest revision, told of every change since.
    assert listed == [last - first] * WATCHERS
    assert sidecar.state.watches.prompt_pace.written >= sum(written)


async def granted(pace: PromptPace) -> None:
    async with pace.turn("waiter") as paced:
        paced.spent(1)


@pytest.mark.parametrize("rate", [0, 10**12])  # no bound; a rate that pays it in a microsecond
async def test_a_reloaded_rate_holds_a_waiter_only_to_the_bytes_owed_at_it(rate: int) -> None:
    """A prompt charged at one byte a second is owed for eleven days; a reload to no bound,
    or to a rate that pays it at once, lets the next watcher go, not the old rate's timer."""
    pace = PromptPace(1)
    async with pace.turn("first") as paced:
        paced.spent(1_000_000)
    waiter = asyncio.create_task(granted(pace))
    await asyncio.sleep(0.05)
    assert not waiter.done()  # held by the pace
    pace.resize(rate)
    await asyncio.wait_for(waiter, END_WAIT_S)


async def test_a_reload_that_sets_a_rate_grants_no_turn_beside_one_granted_without(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A turn granted while no rate is set is still out when a reload sets one: the next
    watcher's turn waits for it to be spent, as it would behind a turn granted at the rate."""
    config = tmp_path / "sidecar.toml"
    config.write_text("prompt_bytes_per_s = 0\nprompt_coalesce_s = 0\n")
    sidecar = await make_sidecar(prompt_bytes_per_s=0, prompt_coalesce_s=0)
    reloader = Reloader(sidecar, str(config), lambda: load_config(config))
    watches = sidecar.state.watches
    async with dsp.connect(sidecar.address) as client, raw_channel(sidecar.address) as channel:
        memory = await client.section("memory", 1, "before")
        stub = raw_stub(channel)
        plain = aiter(stub.WatchPrompt(pb.WatchPromptRequest()))
        await anext(plain)
        await memory.update("then")
        await anext(plain)  # its next prompt's size is known now: it waits for no build
        await eventually(lambda: watches.prompts_in_flight.bytes == 0, "the prompt written")
        (shown,) = watches.shared_prompts()
        async with shown._lock:  # a build in progress: the watcher's next turn waits on it
            await memory.update("after")
            await eventually(
                lambda: watches.prompts_in_flight.bytes > 0, "its turn taken, its build waiting"
            )
            config.write_text(f"prompt_bytes_per_s = {RATE}\nprompt_coalesce_s = 0\n")
            reloaded = reloader.reload("SIGHUP")
            assert reloaded is not None and reloaded.applied == ["prompt_bytes_per_s"]
            rendered = asyncio.ensure_future(
                anext(aiter(stub.WatchPrompt(pb.WatchPromptRequest(render=True))))
            )
            await eventually(
                lambda: rendered.done() or watches.prompt_pace.waiting() == 1,
                "the other watcher sent or waiting",
            )
            assert not rendered.done()  # a turn is out: the new rate allows no second
        assert (await asyncio.wait_for(rendered, END_WAIT_S)).rendered.prompt  # once spent
        latest = await asyncio.wait_for(anext(plain), END_WAIT_S)
        assert latest.revision == sidecar.registry.revision
