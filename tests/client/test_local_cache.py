"""The client's opt-in local cache (`connect(local_cache=True)`): a cacheable assembly is
answered without a call, and no change, whoever makes it, leaves a stale answer behind.

The sidecar counts the Assemble calls it serves (`dsp_assemble_seconds`), which tells a
kept answer from an asked one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, eventually, metric, section_names, tool
from processes import free_port, serve


def served(sidecar: Sidecar) -> float:
    """How many Assemble calls the sidecar has answered."""
    return metric(sidecar, "dsp_assemble_seconds_count")


def texts(assembly: dsp.PromptAssembly) -> dict[str, str]:
    return {section.name: section.text for section in assembly.sections}


@pytest.fixture
async def caching(sidecar: Sidecar) -> AsyncIterator[dsp.Client]:
    """A client of the default sidecar with its local cache on."""
    async with dsp.connect(sidecar.address, local_cache=True) as client:
        yield client


async def test_a_repeated_assemble_of_a_static_scope_makes_no_call(
    sidecar: Sidecar, caching: dsp.Client
) -> None:
    await caching.section("rules", 10, "be brief")
    first = await caching.assemble()
    before = served(sidecar)
    second = await caching.assemble()
    assert served(sidecar) == before and second == first


async def test_without_the_local_cache_every_assemble_is_a_call(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, "be brief")
    await client.assemble()
    before = served(sidecar)
    await client.assemble()
    assert served(sidecar) == before + 1


async def test_each_kept_answer_is_a_copy_the_caller_may_change(caching: dsp.Client) -> None:
    await caching.section("rules", 10, "be brief")
    await caching.tools([tool("search", "find things")])
    await caching.assemble()
    kept = await caching.assemble()
    kept.sections.clear()
    kept.tools[0].parameters["added"] = True
    kept.variables["mine"] = "x"
    second = await caching.assemble()
    assert "rules" in section_names(second) and "added" not in second.tools[0].parameters
    assert "mine" not in second.variables


async def test_a_scope_with_a_provider_is_asked_every_time(
    sidecar: Sidecar, caching: dsp.Client
) -> None:
    await caching.section("clock", 10, lambda context: "now")
    await caching.assemble()
    before = served(sidecar)
    await caching.assemble()
    assert served(sidecar) == before + 1


async def test_a_static_scope_is_kept_once_whatever_the_fields(
    sidecar: Sidecar, caching: dsp.Client
) -> None:
    """An all-static plan ignores the fields (the sidecar's kept answers know it too):
    255 distinct fields are one kept answer, not 255 copies of it (issue 34, item 10)."""
    await caching.section("rules", 10, "be brief")
    first = await caching.assemble(fields={"turn": 0})
    before = served(sidecar)
    for turn in range(1, 256):
        assert await caching.assemble(fields={"turn": turn}) == first
    assert served(sidecar) == before


async def test_an_assemble_with_a_report_is_always_a_call(
    sidecar: Sidecar, caching: dsp.Client
) -> None:
    await caching.assemble()
    before = served(sidecar)
    assembly = await caching.assemble(report=True)
    assert served(sidecar) == before + 1 and assembly.report is not None


# -- read-your-writes: the revision in the client's own replies -----------------------


async def test_an_own_update_is_seen_by_the_next_assemble(caching: dsp.Client) -> None:
    rules = await caching.section("rules", 10, "be brief")
    await caching.assemble()
    await rules.update("be thorough")
    assert texts(await caching.assemble())["rules"] == "be thorough"


async def test_an_own_registration_is_seen_by_the_next_assemble(caching: dsp.Client) -> None:
    await caching.assemble()
    await caching.section("rules", 10, "be brief")
    assert "rules" in section_names(await caching.assemble())


async def test_an_own_disposal_is_seen_by_the_next_assemble(caching: dsp.Client) -> None:
    rules = await caching.section("rules", 10, "be brief")
    await caching.assemble()
    await rules()
    assert "rules" not in section_names(await caching.assemble())


async def test_an_own_listener_is_seen_by_the_next_assemble(caching: dsp.Client) -> None:
    await caching.assemble()

    async def shout(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
    ) -> dsp.PromptAssembly:
        assembly.sections.append(dsp.AssembledSection("shout", "LOUD"))
        return await next(assembly)

    await caching.on_assemble(shout)
    assert "shout" in section_names(await caching.assemble())


# -- others' writes: the change stream ------------------------------------------------


async def test_another_clients_update_reaches_the_kept_answer(
    connect: ClientFactory, caching: dsp.Client
) -> None:
    other = await connect()
    rules = await other.section("rules", 10, "be brief")
    await eventually(lambda: caching_sees(caching, "rules", "be brief"), "the first value")
    await rules.update("be thorough")
    await eventually(lambda: caching_sees(caching, "rules", "be thorough"), "the update")


async def test_another_sessions_end_reaches_the_kept_answer(
    connect: ClientFactory, caching: dsp.Client
) -> None:
    other = await connect()
    await other.section("rules", 10, "be brief")
    await eventually(lambda: caching_sees(caching, "rules", "be brief"), "the section")
    await other.close()
    await eventually(lambda: caching_lacks(caching, "rules"), "the session's end")


async def test_a_re_parented_scope_is_assembled_under_its_new_parent(
    connect: ClientFactory, caching: dsp.Client
) -> None:
    other = await connect()
    team_a, team_b = await other.scope("team-a"), await other.scope("team-b")
    await team_a.section("team", 10, "a")
    await team_b.section("team", 10, "b")
    worker = await other.scope("worker", parent="team-a")
    await eventually(lambda: caching_sees(caching, "team", "a", "worker"), "team-a's section")
    await worker.dispose()
    await other.scope("worker", parent="team-b")
    await eventually(lambda: caching_sees(caching, "team", "b", "worker"), "team-b's section")


async def test_a_sidecar_restart_leaves_no_answer_of_the_old_one() -> None:
    address = f"127.0.0.1:{free_port()}"
    async with serve("--listen", address) as first, dsp.connect(address) as owner:
        rules = await owner.section("rules", 10, "v0")
        async with dsp.connect(address, local_cache=True) as caching:
            for version in range(1, 20):  # the old revision far above the new sidecar's
                await rules.update(f"v{version}")
            await eventually(lambda: caching_sees(caching, "rules", "v19"), "the last value")
            first.process.kill()
            await first.process.wait()
            async with serve("--listen", address):
                await eventually(lambda: owner.connected, "the owner replays", timeout=20)
                await eventually(lambda: caching.connected, "the cache's client", timeout=20)
                await rules.update("after the restart")
                await eventually(
                    lambda: caching_sees(caching, "rules", "after the restart"),
                    "the new sidecar's value",
                    timeout=20,
                )


async def caching_sees(client: dsp.Client, name: str, text: str, scope: str | None = None) -> bool:
    try:
        return texts(await client.assemble(scope)).get(name) == text
    except dsp.SystemPromptError:
        return False  # reconnecting


async def caching_lacks(client: dsp.Client, name: str) -> bool:
    return name not in section_names(await client.assemble())


def _greeting() -> dsp.Rule:
    """A rule that appends a section when fields.who is set."""
    part = dsp.RulePart("greeting", 50, "'Hello ' + fields.who + '.'")
    return dsp.Rule([dsp.Mutation.upsert_sections(part)], match=["'who' in fields"])


async def test_a_rules_only_scope_is_kept_by_its_fields(
    sidecar: Sidecar, caching: dsp.Client
) -> None:
    await caching.section("rules", 10, "be brief")
    await caching.rule("greet", _greeting())
    first = await caching.assemble(fields={"who": "ada"})
    before = served(sidecar)
    again = await caching.assemble(fields={"who": "ada"})
    assert served(sidecar) == before and again == first  # the second answered here
    assert texts(again)["greeting"] == "Hello ada."
    other = await caching.assemble(fields={"who": "bob"})
    assert served(sidecar) == before + 1 and texts(other)["greeting"] == "Hello bob."
    bare = await caching.assemble()
    assert served(sidecar) == before + 2 and "greeting" not in texts(bare)
    await caching.assemble(fields={"who": "bob"})
    assert served(sidecar) == before + 2  # each kept under its own fields


async def greets(caching: dsp.Client, text: str | None) -> bool:
    """Whether `caching`'s assembly for fields.who "ada" greets with `text` (None: not)."""
    return texts(await caching.assemble(fields={"who": "ada"})).get("greeting") == text


async def test_a_rule_update_or_disposal_drops_the_answers_kept_by_fields(
    sidecar: Sidecar, connect: ClientFactory, caching: dsp.Client
) -> None:
    other = await connect()  # another client's rule: its changes come by the stream
    await caching.section("rules", 10, "be brief")
    handle = await other.rule("greet", _greeting())
    await eventually(lambda: greets(caching, "Hello ada."), "the rule")
    before = served(sidecar)
    assert await greets(caching, "Hello ada.") and served(sidecar) == before  # kept
    shout = dsp.RulePart("greeting", 50, "'HELLO ' + fields.who + '!'")
    await handle.update(dsp.Rule([dsp.Mutation.upsert_sections(shout)], match=["'who' in fields"]))
    await eventually(lambda: greets(caching, "HELLO ada!"), "the update")
    await handle()
    await eventually(lambda: greets(caching, None), "the disposal")


async def test_a_scope_with_a_rule_and_a_listener_is_asked_every_time(
    sidecar: Sidecar, caching: dsp.Client
) -> None:
    async def same(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: dsp.Next
    ) -> dsp.PromptAssembly:
        return await next(assembly)

    await caching.rule("greet", _greeting())
    await caching.on_assemble(same)
    await caching.assemble(fields={"who": "ada"})
    before = served(sidecar)
    await caching.assemble(fields={"who": "ada"})
    assert served(sidecar) == before + 1
