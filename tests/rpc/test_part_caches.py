"""A dynamic plan's response joined from the plan's per-part encoding and render caches:
byte for byte the canonical encoding of what a fresh assembly holds, and never a kept
encoding or rendering of a part (or variable) that changed."""

from __future__ import annotations

import gc
import itertools
import sys
import types
from collections.abc import AsyncIterator

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.wire import encoding
from helpers import IDENTITY, ClientFactory, SidecarFactory, raw_channel

ASSEMBLE = "/dsh.systemprompt.v1.SystemPromptService/Assemble"
Raw = grpc.aio.UnaryUnaryMultiCallable


@pytest.fixture
async def assemble_raw(sidecar: Sidecar) -> AsyncIterator[Raw]:
    """Assemble, its response's bytes as the sidecar sent them."""
    channel = raw_channel(sidecar.address)
    yield channel.unary_unary(ASSEMBLE, request_serializer=pb.AssembleRequest.SerializeToString)
    await channel.close()


async def assembled(assemble_raw: Raw, scope: str = "") -> pb.AssembleResponse:
    """A rendered assembly of `scope`, checked to be its canonical encoding (what the
    response would be if it were built message by message, no cache)."""
    request = pb.AssembleRequest(context=pb.AssembleContext(scope=scope), render=True)
    raw: bytes = await assemble_raw(request)
    response = pb.AssembleResponse.FromString(raw)
    assert raw == response.SerializeToString()
    return response


def texts(response: pb.AssembleResponse) -> list[str]:
    """The sections' texts but the defaults (the identity first, an empty one)."""
    sections = [section.text for section in response.assembly.sections]
    assert sections[0] == IDENTITY
    return [text for text in sections[1:] if text]


def prompt(*sections: str) -> str:
    """The rendered prompt of the identity section and `sections`."""
    return "\n\n".join((IDENTITY, *sections))


def served(response: pb.AssembleResponse) -> list[str]:
    """`texts(response)`, checked to be what its rendered prompt joins after the identity."""
    shown = texts(response)
    assert response.rendered.prompt == prompt(*shown)
    return shown


def counting(label: str) -> dsp.TextSource:
    """A provider whose answer changes at every call."""
    counter = itertools.count()
    return lambda context: f"{label} {next(counter)}"


async def warmed(client: dsp.Client, assemble_raw: Raw) -> dsp.Handle:
    """A static section beside a provided one, assembled once (the caches filled)."""
    static = await client.section("static", 10, "Be brief.")
    await client.section("clock", 20, lambda context: "Tick.")
    await assembled(assemble_raw)
    return static


async def test_an_unchanged_dynamic_answer_is_answered_byte_identical(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    await warmed(client, assemble_raw)
    assert served(await assembled(assemble_raw)) == ["Be brief.", "Tick."]


async def test_a_changed_dynamic_answer_is_encoded_and_rendered_fresh(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    await client.section("static", 10, "Be brief.")
    await client.section("clock", 20, counting("Tick"))
    first, second = await assembled(assemble_raw), await assembled(assemble_raw)
    assert texts(first) == ["Be brief.", "Tick 0"]
    assert served(second) == ["Be brief.", "Tick 1"]


async def test_an_updated_static_part_of_a_dynamic_plan_is_served_fresh(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    await (await warmed(client, assemble_raw)).update("Be thorough.")
    assert served(await assembled(assemble_raw)) == ["Be thorough.", "Tick."]


async def test_a_disposed_part_of_a_dynamic_plan_is_gone_from_encoding_and_rendering(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    await (await warmed(client, assemble_raw))()
    assert served(await assembled(assemble_raw)) == ["Tick."]


async def test_a_new_registration_joins_a_dynamic_plans_response(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    await client.section("clock", 20, lambda context: "Tick.")
    await assembled(assemble_raw)
    await client.section("static", 10, "Be brief.")
    await client.tools([dsp.ToolSchema("grep", "Search.", {"type": "object"})])
    after = await assembled(assemble_raw)
    assert texts(after) == ["Be brief.", "Tick."]
    assert [tool.name for tool in after.assembly.tools] == ["grep"]


async def test_a_changed_variable_re_renders_an_unchanged_section(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    await client.section("greeting", 10, "Hello {{user}}.")
    await client.variable("user", counting("user"))
    first, second = await assembled(assemble_raw), await assembled(assemble_raw)
    assert first.rendered.prompt == prompt("Hello user 0.")
    assert second.rendered.prompt == prompt("Hello user 1.")


async def test_a_render_failure_is_not_kept_once_the_variable_has_a_value(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    answers = iter([None, "ada"])
    await client.section("greeting", 10, "Hello {{user}}.")
    await client.variable("user", lambda context: next(answers))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await assembled(assemble_raw)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    after = await assembled(assemble_raw)
    assert after.rendered.prompt == prompt("Hello ada.")


async def test_a_re_parented_scope_is_served_its_new_parents_parts(
    client: dsp.Client, connect: ClientFactory, assemble_raw: Raw
) -> None:
    team_a, team_b = await client.scope("team-a"), await client.scope("team-b")
    await team_a.section("team", 10, "Team A's way.")
    await team_b.section("team", 10, "Team B's way.")
    other = await connect()
    agent = await other.scope("agent-1", parent="team-a")
    await agent.section("clock", 20, lambda context: "Tick.")
    assert texts(await assembled(assemble_raw, "agent-1")) == ["Team A's way.", "Tick."]
    await agent.dispose()  # the key is forgotten with its last handle, parent included
    moved = await other.scope("agent-1", parent="team-b")
    await moved.section("clock", 20, lambda context: "Tick.")
    assert served(await assembled(assemble_raw, "agent-1")) == ["Team B's way.", "Tick."]


async def test_a_listener_that_reorders_adds_and_removes_parts_is_encoded_as_it_returned(
    client: dsp.Client, assemble_raw: Raw
) -> None:
    calls = itertools.count()

    async def shuffle(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
    ) -> dsp.PromptAssembly:
        result = await next_()
        turn = next(calls)
        if turn == 1:
            result.sections[1:] = reversed(result.sections[1:])
        elif turn == 2:
            result.sections.append(dsp.AssembledSection("note", "Added."))
        elif turn == 3:
            result.sections = [part for part in result.sections if part.name != "a"]
        return result

    await client.section("a", 10, "First.")
    await client.section("b", 20, "Second.")
    await client.on_assemble(shuffle)
    seen = [texts(await assembled(assemble_raw)) for _ in range(4)]
    assert seen == [
        ["First.", "Second."],
        ["Second.", "First."],
        ["First.", "Second.", "Added."],
        ["Second."],
    ]


def reachable_bytes(*roots: object) -> int:
    """The memory of every object `roots` keep alive, each once: not classes, modules and
    functions (what they are, not what they keep), nor numbers (their bookkeeping)."""
    seen: dict[int, object] = {}
    todo = list(roots)
    skipped = type | types.ModuleType | types.FunctionType | int
    while todo:
        kept = todo.pop()
        if id(kept) in seen or isinstance(kept, skipped):
            continue
        seen[id(kept)] = kept
        todo.extend(gc.get_referents(kept))
    return sum(map(sys.getsizeof, seen.values()))


WIDE = "x" * (200 * 1024) + "\U0001f600"  # one emoji: Python keeps 4 bytes a character


async def answered_in_scopes(client: dsp.Client, count: int) -> None:
    """`count` scopes, each with a provider answering its own 200 KiB text, assembled and
    rendered once each: `count` dynamic plans' caches, each ~1 MB."""
    for index in range(count):
        scope = await client.scope(f"agent-{index}")
        answer = f"{index} {WIDE}"
        await scope.section("wide", 10, lambda context, answer=answer: answer)
        await client.assemble(f"agent-{index}")
        await client.render(f"agent-{index}")


async def test_the_part_caches_keep_no_more_than_max_response_cache_bytes_with_their_texts(
    make_sidecar: SidecarFactory,
) -> None:
    budget = 4 * 1024 * 1024
    sidecar = await make_sidecar(limits={"max_response_cache_bytes": budget})
    async with dsp.connect(sidecar.address) as client:
        await answered_in_scopes(client, 12)
        # while the session lives: once it ends, its plans go, and their caches with them
        parts = sidecar.state.assembler.parts
        assert len(parts) >= 2  # the bound holds with caches kept, not by keeping none
        # counting their fields alone, they kept twice the bound (8.2 MB)
        assert reachable_bytes(*parts) <= budget


async def test_the_encoded_parts_kept_by_value_stay_within_their_bound_with_their_texts(
    client: dsp.Client,
) -> None:
    await answered_in_scopes(client, 48)  # 48 MB of answers, held and encoded
    # counting each as twice its encoding, they kept 59 MB against 32 MiB
    kept = itertools.chain.from_iterable(encoding.ENCODINGS.kept())
    assert reachable_bytes(*kept) <= encoding.ENCODINGS.max_bytes


async def test_a_plans_part_caches_go_with_it_when_a_change_replaces_it(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    scope = await client.scope("agent")
    await scope.section("dynamic", 10, lambda context: "answer")
    for index in range(20):  # each a change: a new plan, whose first response keeps caches
        await scope.section(f"static-{index}", 20 + index, "static")
        await client.render("agent")
    # no collection needed: the dead plans' caches were kept until the budget's bytes ran
    # out, and each assembly's waterfall held its plan in a cycle until a collection
    assert len(sidecar.state.assembler.parts) == 1
