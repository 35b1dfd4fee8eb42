"""Cacheable callbacks: providers and listeners that declare what their answer depends
on are asked once, and asked again after every change that could change the answer."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, SidecarFactory, eventually, rejection, section_names


class Counted:
    """A text provider that answers how many times it was asked."""

    def __init__(self, prefix: str = "asked") -> None:
        self.prefix = prefix
        self.calls = itertools.count(1)
        self.asked = 0

    def __call__(self, context: dsp.AssembleContext) -> str:
        self.asked = next(self.calls)
        return f"{self.prefix} {self.asked}"


class CountedListener:
    """A listener that appends a section naming how many times it was invoked."""

    def __init__(self, section: str = "listened") -> None:
        self.section = section
        self.invoked = 0

    async def __call__(
        self, assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> Any:
        self.invoked += 1
        assembly.sections.append(dsp.AssembledSection(self.section, f"invoked {self.invoked}"))
        return next_()


def text_of(assembly: dsp.PromptAssembly, name: str) -> str:
    return next(section.text for section in assembly.sections if section.name == name)


async def test_a_provider_without_a_cache_policy_is_asked_at_every_assembly(
    client: dsp.Client,
) -> None:
    provider = Counted()
    await client.section("dynamic", 1, provider)
    await client.assemble()
    assert text_of(await client.assemble(), "dynamic") == "asked 2"


async def test_a_revision_cached_provider_is_asked_once_per_revision(client: dsp.Client) -> None:
    provider = Counted()
    await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    first = await client.assemble(fields={"who": "a"})
    second = await client.assemble(scope="other", fields={"who": "b"})
    assert text_of(first, "dynamic") == text_of(second, "dynamic") == "asked 1"
    assert provider.asked == 1


async def test_a_registration_anywhere_drops_cached_answers(client: dsp.Client) -> None:
    provider = Counted()
    await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    await client.assemble()
    await client.section("unrelated", 2, "static")
    assert text_of(await client.assemble(), "dynamic") == "asked 2"


async def test_an_update_and_a_disposal_drop_cached_answers(client: dsp.Client) -> None:
    provider = Counted()
    await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    other = await client.section("other", 2, "one")
    await client.assemble()
    await other.update("two")
    assert text_of(await client.assemble(), "dynamic") == "asked 2"
    await other()
    assert text_of(await client.assemble(), "dynamic") == "asked 3"


async def test_a_fields_cached_provider_is_asked_once_per_context(client: dsp.Client) -> None:
    seen: list[object] = []

    def provide(context: dsp.AssembleContext) -> str:
        seen.append(context.get("who"))
        return f"for {context.get('who')}"

    await client.section("dynamic", 1, provide, cache=dsp.Cache.FIELDS)
    for who in ("a", "b", "a", "b"):
        assert text_of(await client.assemble(fields={"who": who}), "dynamic") == f"for {who}"
    assert seen == ["a", "b"]


async def test_a_provider_invalidating_its_answers_is_asked_again(client: dsp.Client) -> None:
    provider = Counted()
    handle = await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    await client.assemble()
    await client.assemble()
    await handle.invalidate()
    assert text_of(await client.assemble(), "dynamic") == "asked 2"


async def test_invalidating_one_provider_keeps_the_others_answers(client: dsp.Client) -> None:
    kept, dropped = Counted(), Counted()
    await client.section("kept", 1, kept, cache=dsp.Cache.REVISION)
    handle = await client.section("dropped", 2, dropped, cache=dsp.Cache.REVISION)
    await client.assemble()
    await handle.invalidate()
    assembly = await client.assemble()
    assert (text_of(assembly, "kept"), text_of(assembly, "dropped")) == ("asked 1", "asked 2")


async def test_a_ttl_cached_answer_is_asked_again_once_it_expires(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    now = [1000.0]
    sidecar.registry.callbacks._clock = lambda: now[0]  # the sidecar's clock, moved by hand
    provider = Counted()
    await client.section("dynamic", 1, provider, cache=dsp.Cache.ttl(10))
    await client.assemble()
    now[0] += 9
    assert text_of(await client.assemble(), "dynamic") == "asked 1"
    now[0] += 2
    assert text_of(await client.assemble(), "dynamic") == "asked 2"


async def test_a_cached_provider_of_an_ended_session_is_asked_no_more(
    connect: ClientFactory,
) -> None:
    owner, reader = await connect(), await connect()
    await owner.section("dynamic", 1, Counted(), cache=dsp.Cache.REVISION)
    assert "dynamic" in section_names(await reader.assemble())
    await owner.close()
    assert "dynamic" not in section_names(await reader.assemble())


async def test_a_cached_listener_is_invoked_once_for_the_same_input(client: dsp.Client) -> None:
    listener = CountedListener()
    await client.on_assemble(listener, cache=dsp.Cache.REVISION)
    await client.assemble()
    assert text_of(await client.assemble(), "listened") == "invoked 1"
    assert listener.invoked == 1


async def test_a_cached_listener_is_invoked_again_when_its_input_changes(
    client: dsp.Client,
) -> None:
    listener = CountedListener()
    await client.on_assemble(listener, cache=dsp.Cache.REVISION)
    await client.section("asked-every-time", 1, Counted())  # so the input differs each time
    await client.assemble()
    assert text_of(await client.assemble(), "listened") == "invoked 2"


async def test_a_listener_added_or_removed_drops_cached_results(client: dsp.Client) -> None:
    listener = CountedListener()
    await client.on_assemble(listener, cache=dsp.Cache.REVISION)
    await client.assemble()
    other = await client.on_assemble(
        CountedListener("other"), cache=dsp.Cache.REVISION, prepend=True
    )
    await client.assemble()
    assert listener.invoked == 2
    await other()
    await client.assemble()
    assert listener.invoked == 3


async def test_a_listener_invalidating_its_results_is_invoked_again(client: dsp.Client) -> None:
    listener = CountedListener()
    handle = await client.on_assemble(listener, cache=dsp.Cache.REVISION)
    await client.assemble()
    await handle.invalidate()
    assert text_of(await client.assemble(), "listened") == "invoked 2"


async def test_a_cached_listener_after_one_asked_every_time_is_reused_for_the_same_input(
    client: dsp.Client,
) -> None:
    first, cached = CountedListener("first"), CountedListener()

    async def unchanged(assembly: dsp.PromptAssembly, context: Any, next_: Any) -> Any:
        first.invoked += 1
        return next_()

    await client.on_assemble(unchanged)
    await client.on_assemble(cached, cache=dsp.Cache.REVISION)
    await client.assemble()
    await client.assemble()
    assert (first.invoked, cached.invoked) == (2, 1)


async def test_a_listener_asked_every_time_after_a_cached_one_keeps_it_invoked(
    client: dsp.Client,
) -> None:
    cached, after = CountedListener(), CountedListener("after")
    await client.on_assemble(cached, cache=dsp.Cache.REVISION)
    await client.on_assemble(after)
    await client.assemble()
    await client.assemble()
    assert (cached.invoked, after.invoked) == (2, 2)


async def test_an_all_cached_plan_answers_without_a_hop(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    provider, listener = Counted(), CountedListener()
    await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    await client.on_assemble(listener, cache=dsp.Cache.REVISION)
    first = await client.assemble()
    assert await client.assemble() == first
    assert (provider.asked, listener.invoked) == (1, 1)
    session = sidecar.state.sessions.get(client.session_id)
    assert session.provide_requests == 1


async def test_a_report_asks_every_callback(client: dsp.Client) -> None:
    provider = Counted()
    await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
    await client.assemble()
    await client.assemble(report=True)
    assert provider.asked == 2


async def test_a_restarted_sidecar_asks_again(make_sidecar: SidecarFactory) -> None:
    first = await make_sidecar()
    address = first.address
    provider = Counted()
    client = await dsp.connect(address)
    try:
        await client.section("dynamic", 1, provider, cache=dsp.Cache.REVISION)
        await client.assemble()
        await first.server.stop(grace=None)
        await eventually(lambda: not client.connected, "the client sees it down", timeout=10)
        await make_sidecar(address)
        await eventually(lambda: client.connected, "the client reconnects", timeout=20)
        assert text_of(await client.assemble(timeout=5), "dynamic") == "asked 2"
    finally:
        await client.close()


async def test_cache_on_a_static_value_is_refused_in_the_client(client: dsp.Client) -> None:
    error = await rejection(client.section("static", 1, "text", cache=dsp.Cache.REVISION))
    assert error.reason == dsp.Reason.INVALID_VALUE


def test_a_time_to_live_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        dsp.Cache.ttl(0)


async def test_an_answer_given_while_its_provider_invalidated_is_not_kept(
    client: dsp.Client,
) -> None:
    asked = 0
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow(context: dsp.AssembleContext) -> str:
        nonlocal asked
        asked += 1
        started.set()
        await release.wait()
        return f"asked {asked}"

    handle = await client.section("dynamic", 1, slow, cache=dsp.Cache.REVISION)
    first = asyncio.create_task(client.assemble())
    await started.wait()
    await handle.invalidate()  # while the first answer is being computed
    release.set()
    assert text_of(await first, "dynamic") == "asked 1"
    assert text_of(await client.assemble(), "dynamic") == "asked 2"


async def test_the_sidecar_confirms_the_callback_cache_feature(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    session = client._connection._session  # what the sidecar answered to SessionStart
    assert session is not None and session.callback_cache
