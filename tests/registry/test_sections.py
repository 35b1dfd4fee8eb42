"""Prompt sections and runtime contexts with static text (contract.md sections 2 and 3)."""

from __future__ import annotations

import math

import dsh_system_prompt as dsp
import grpc
import pytest
from helpers import (
    IDENTITY,
    NON_FINITE,
    ClientFactory,
    ClientOf,
    TextKind,
    added,
    context,
    failure,
    refusal,
    registered,
    rejection,
    section,
    section_names,
)

IDENTITY_SECTION = "harness:identity"


# -- built-in sections ----------------------------------------------------------------


async def test_every_assembly_opens_with_the_harness_identity(client: dsp.Client) -> None:
    assembly = await client.assemble()
    assert assembly.sections[0] == section(IDENTITY_SECTION, IDENTITY)


async def test_the_harness_identity_sits_at_order_minus_100(client: dsp.Client) -> None:
    await client.section("just-after", -99, "after")
    await client.section("just-before", -101, "before")
    assembly = await client.assemble()
    assert section_names(assembly)[:3] == ["just-before", IDENTITY_SECTION, "just-after"]


async def test_the_persona_comes_from_the_config(client_of: ClientOf) -> None:
    async with client_of(persona="You are a careful reviewer.") as client:
        assembly = await client.assemble()
    assert assembly.sections == [
        section(IDENTITY_SECTION, IDENTITY),
        section(dsp.PERSONA_SECTION, "You are a careful reviewer."),
    ]


async def test_the_persona_sits_at_order_zero(client: dsp.Client) -> None:
    await client.section("after", 1, "after")
    await client.section("before", -1, "before")
    assembly = await client.assemble()
    assert section_names(assembly) == [IDENTITY_SECTION, "before", dsp.PERSONA_SECTION, "after"]
    assert dsp.PERSONA_ORDER == 0


async def test_a_section_at_order_zero_follows_the_earlier_registered_persona(
    client: dsp.Client,
) -> None:
    await client.section("also-zero", 0, "tie")
    assembly = await client.assemble()
    assert section_names(assembly) == [IDENTITY_SECTION, dsp.PERSONA_SECTION, "also-zero"]


async def test_include_harness_identity_false_omits_only_the_identity(
    client_of: ClientOf,
) -> None:
    async with client_of(include_harness_identity=False, persona="Persona.") as client:
        await client.section("rules", 10, "Be precise.")
        assembly = await client.assemble()
    assert assembly.sections == [
        section(dsp.PERSONA_SECTION, "Persona."),
        section("rules", "Be precise."),
    ]


async def test_the_built_in_sections_survive_a_session_closing(connect: ClientFactory) -> None:
    first = await connect()
    await first.section("mine", 5, "mine")
    await first.close()
    second = await connect()
    assembly = await second.assemble()
    assert section_names(assembly) == [IDENTITY_SECTION, dsp.PERSONA_SECTION]


async def test_a_global_section_named_like_a_built_in_is_a_duplicate(client: dsp.Client) -> None:
    error = await rejection(client.section(dsp.PERSONA_SECTION, 0, "Another persona."))
    assert error.code == grpc.StatusCode.ALREADY_EXISTS
    assert error.reason == "DUPLICATE_NAME"


# -- ordering -------------------------------------------------------------------------


async def test_sections_are_sorted_by_ascending_order(client: dsp.Client) -> None:
    ordered = await added(client, "section", ("thirty", 30), ("ten", 10), ("twenty", 20))
    assert ordered == ["ten", "twenty", "thirty"]


async def test_fractional_orders_sort_numerically(client: dsp.Client) -> None:
    ordered = await added(client, "section", ("two", 2), ("one-and-a-half", 1.5), ("one", 1))
    assert ordered == ["one", "one-and-a-half", "two"]


async def test_sections_with_equal_order_keep_registration_order(client: dsp.Client) -> None:
    ordered = await added(client, "section", ("bravo", 150), ("alpha", 150), ("charlie", 150))
    assert ordered == ["bravo", "alpha", "charlie"]


async def test_negative_orders_come_before_the_persona(client: dsp.Client) -> None:
    await client.section("minus-five", -5, "-5")
    await client.section("minus-two-hundred", -200, "-200")
    assembly = await client.assemble()
    assert section_names(assembly) == [
        "minus-two-hundred",
        IDENTITY_SECTION,
        "minus-five",
        dsp.PERSONA_SECTION,
    ]


async def test_sections_of_all_sessions_are_ordered_together(connect: ClientFactory) -> None:
    first, second = await connect(), await connect()
    await first.section("a-150", 150, "a")
    await second.section("b-120", 120, "b")
    await first.section("a-110", 110, "a")
    assembly = await second.assemble()
    assert section_names(assembly)[2:] == ["a-110", "b-120", "a-150"]


async def test_a_section_keeps_its_text_exactly(client: dsp.Client) -> None:
    text = "  Line one.\n\nLine two with unicode: héllo ✓ 𝄞  \n"
    await client.section("exact", 10, text)
    assembly = await client.assemble()
    assert assembly.sections[-1] == section("exact", text)


async def test_changing_a_returned_assembly_changes_nothing_in_the_registry(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.variable("model", "deepseek-v4")
    first = await client.assemble()
    expected = await client.assemble()
    first.sections.clear()
    first.variables["model"] = "changed"
    first.contexts.append(context("injected", "x"))
    assert await client.assemble() == expected


# -- duplicates, orders, rejected registrations (a section and a context alike) -------

KINDS = ["section", "context"]

OVERRIDE_HINT = " (for a per-agent override, register through that agent's scope instead)"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("scoped", "where"),
    [(False, OVERRIDE_HINT), (True, " in this scope")],
    ids=["global-with-the-override-hint", "in-a-scope"],
)
async def test_a_duplicate_name_is_rejected_saying_where(
    client: dsp.Client, scoped: bool, where: str, kind: TextKind
) -> None:
    register = getattr(await client.scope("agent-1") if scoped else client, kind)
    await register("rules", 10, "first")
    error = await rejection(register("rules", 20, "second"))
    assert failure(error) == refusal(
        "DUPLICATE_NAME", f'prompt {kind} "rules" is already registered{where}'
    )


async def test_a_global_section_name_is_unique_across_sessions(connect: ClientFactory) -> None:
    first, second = await connect(), await connect()
    await first.section("rules", 10, "first")
    error = await rejection(second.section("rules", 10, "second"))
    assert error.code == grpc.StatusCode.ALREADY_EXISTS
    assert error.reason == "DUPLICATE_NAME"


@pytest.mark.parametrize("order", NON_FINITE)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("scoped", [False, True], ids=["global", "in-a-scope"])
async def test_a_non_finite_order_is_rejected(
    client: dsp.Client, scoped: bool, kind: TextKind, order: float
) -> None:
    layer = await client.scope("agent-1") if scoped else client
    error = await rejection(getattr(layer, kind)("bad-order", order, "text"))
    assert failure(error) == refusal(
        "INVALID_ORDER", f'prompt {kind} "bad-order" order must be a finite number'
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_a_rejected_duplicate_leaves_the_first_in_place(
    client: dsp.Client, kind: TextKind
) -> None:
    register = getattr(client, kind)
    await register("rules", 10, "first")
    await rejection(register("rules", 20, "second"))
    assert registered(await client.assemble(), kind) == [("rules", "first")]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_registration_rejected_for_its_order_leaves_nothing_behind(
    client: dsp.Client, kind: TextKind
) -> None:
    register = getattr(client, kind)
    before = await client.assemble()
    await rejection(register("bad-order", math.nan, "text"))
    assert await client.assemble() == before
    await register("bad-order", 5, "now fine")  # the name was not taken
    assert registered(await client.assemble(), kind) == [("bad-order", "now fine")]


@pytest.mark.parametrize("kind", KINDS)
async def test_disposing_a_registration_removes_it(client: dsp.Client, kind: TextKind) -> None:
    before = await client.assemble()
    off = await getattr(client, kind)("rules", 10, "Be precise.")
    await off()
    assert await client.assemble() == before


@pytest.mark.parametrize("kind", KINDS)
async def test_disposing_a_registration_frees_its_name(client: dsp.Client, kind: TextKind) -> None:
    register = getattr(client, kind)
    off = await register("rules", 10, "old")
    await off()
    await register("rules", 10, "new")
    assert registered(await client.assemble(), kind) == [("rules", "new")]


# -- complete sections ----------------------------------------------------------------


async def test_a_complete_section_becomes_the_only_section(client: dsp.Client) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("all", 50, "Exact prompt.", complete=True)
    await client.section("later", 60, "Later.")
    assembly = await client.assemble()
    assert assembly.sections == [section("all", "Exact prompt.")]


async def test_a_complete_section_leaves_contexts_tools_and_variables(
    client: dsp.Client,
) -> None:
    await client.section("all", 0.5, "Exact prompt for {{model}}.", complete=True)
    await client.context("policy", 1, "Mode: plan.")
    await client.tools([dsp.ToolSchema("echo", "echo back", {"type": "object"})])
    await client.variable("model", "deepseek-v4")
    assembly = await client.assemble()
    assert assembly == dsp.PromptAssembly(
        sections=[section("all", "Exact prompt for {{model}}.")],
        contexts=[context("policy", "Mode: plan.")],
        tools=[dsp.ToolSchema("echo", "echo back", {"type": "object"})],
        variables={"model": "deepseek-v4"},
    )


async def test_a_complete_section_renders_as_the_whole_prompt(client: dsp.Client) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("all", 0, "Exact prompt.", complete=True)
    rendered = await client.render()
    assert rendered.prompt == "Exact prompt."


@pytest.mark.parametrize("call", ["assemble", "render"])
async def test_two_complete_sections_reject_an_assembly_and_a_render(
    client: dsp.Client, call: str
) -> None:
    await client.section("first", 1, "One.", complete=True)
    await client.section("second", 2, "Two.", complete=True)
    error = await rejection(getattr(client, call)())
    assert failure(error) == refusal(
        "MULTIPLE_COMPLETE_SECTIONS",
        'multiple complete prompt sections are active: "first", "second"',
    )


async def test_disposing_one_of_two_complete_sections_restores_the_assembly(
    client: dsp.Client,
) -> None:
    await client.section("first", 1, "One.", complete=True)
    off = await client.section("second", 2, "Two.", complete=True)
    await rejection(client.assemble())
    await off()
    assembly = await client.assemble()
    assert assembly.sections == [section("first", "One.")]


async def test_disposing_the_complete_section_restores_every_section(client: dsp.Client) -> None:
    await client.section("rules", 10, "Be precise.")
    off = await client.section("all", 0, "Exact prompt.", complete=True)
    await off()
    assembly = await client.assemble()
    assert section_names(assembly) == [IDENTITY_SECTION, dsp.PERSONA_SECTION, "rules"]


async def test_a_scoped_complete_section_shadowing_a_global_one_is_the_only_effective_one(
    client: dsp.Client,
) -> None:
    await client.section("all", 0, "Global exact prompt.", complete=True)
    scope = await client.scope("agent-1")
    await scope.section("all", 0, "Agent exact prompt.", complete=True)
    assembly = await client.assemble(scope="agent-1")
    assert assembly.sections == [section("all", "Agent exact prompt.")]


async def test_a_global_and_a_scoped_complete_section_reject_that_scopes_assembly(
    client: dsp.Client,
) -> None:
    await client.section("global-all", 0, "Global.", complete=True)
    scope = await client.scope("agent-1")
    await scope.section("agent-all", 0, "Agent.", complete=True)
    error = await rejection(client.assemble(scope="agent-1"))
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "MULTIPLE_COMPLETE_SECTIONS"
    global_assembly = await client.assemble()
    assert global_assembly.sections == [section("global-all", "Global.")]


async def test_a_complete_section_shadowed_by_an_ordinary_one_is_not_effective(
    client: dsp.Client,
) -> None:
    await client.section("all", 50, "Exact prompt.", complete=True)
    scope = await client.scope("agent-1")
    await scope.section("all", 50, "Just a section.")
    assembly = await client.assemble(scope="agent-1")
    assert assembly.sections == [
        section(IDENTITY_SECTION, IDENTITY),
        section(dsp.PERSONA_SECTION, ""),
        section("all", "Just a section."),
    ]
