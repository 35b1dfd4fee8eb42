"""Prompt variables with static values (contract.md sections 2 and 3)."""

from __future__ import annotations

import dsh_system_prompt as dsp
import grpc
import pytest
from helpers import ClientFactory, chain, failure, refusal, rejection


@pytest.mark.parametrize("name", ["a", "model", "cwd", "m2", "git_state", "a_1_b", "x__"])
async def test_a_name_matching_the_pattern_is_accepted(client: dsp.Client, name: str) -> None:
    await client.variable(name, "value")
    assembly = await client.assemble()
    assert assembly.variables == {name: "value"}


@pytest.mark.parametrize(
    "name",
    [
        "Not Valid",
        "Model",
        "mOdel",
        "1model",
        "_model",
        "model-name",
        "model name",
        "model.name",
        "modèle",
        "model\n",
        "",
    ],
)
async def test_a_name_not_matching_the_pattern_is_rejected(client: dsp.Client, name: str) -> None:
    error = await rejection(client.variable(name, "value"))
    assert failure(error) == refusal(
        "INVALID_VARIABLE_NAME",
        f'invalid prompt variable name "{name}" (must match /^[a-z][a-z0-9_]*$/)',
    )


async def test_an_invalid_name_is_rejected_in_a_scope_too(client: dsp.Client) -> None:
    scope = await client.scope("agent-1")
    error = await rejection(scope.variable("Not Valid", "value"))
    assert failure(error) == refusal(
        "INVALID_VARIABLE_NAME",
        'invalid prompt variable name "Not Valid" (must match /^[a-z][a-z0-9_]*$/)',
    )


async def test_a_rejected_variable_leaves_nothing_behind(client: dsp.Client) -> None:
    await rejection(client.variable("Not Valid", "value"))
    assert (await client.assemble()).variables == {}


async def test_a_duplicate_global_variable_is_rejected(client: dsp.Client) -> None:
    await client.variable("model", "deepseek-v4")
    error = await rejection(client.variable("model", "other"))
    assert failure(error) == refusal(
        "DUPLICATE_NAME", 'prompt variable "model" is already registered'
    )


async def test_a_rejected_duplicate_keeps_the_first_value(client: dsp.Client) -> None:
    await client.variable("model", "deepseek-v4")
    await rejection(client.variable("model", "other"))
    assert (await client.assemble()).variables == {"model": "deepseek-v4"}


async def test_a_global_variable_name_is_unique_across_sessions(connect: ClientFactory) -> None:
    first, second = await connect(), await connect()
    await first.variable("model", "deepseek-v4")
    error = await rejection(second.variable("model", "other"))
    assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "DUPLICATE_NAME")


async def test_a_duplicate_variable_in_a_scope_is_rejected(client: dsp.Client) -> None:
    scope = await client.scope("agent-1")
    await scope.variable("model", "deepseek-v4")
    error = await rejection(scope.variable("model", "other"))
    assert (error.code, error.reason) == (grpc.StatusCode.ALREADY_EXISTS, "DUPLICATE_NAME")
    assert error.message.startswith('prompt variable "model" is already registered')


async def test_a_static_value_is_in_the_assembly(client: dsp.Client) -> None:
    await client.variable("model", "deepseek-v4")
    assert (await client.assemble()).variables == {"model": "deepseek-v4"}


async def test_a_static_value_is_kept_exactly(client: dsp.Client) -> None:
    value = "  two\nlines, {{braces}} and ünïcode 𝄞 "
    await client.variable("odd", value)
    assert (await client.assemble()).variables == {"odd": value}


async def test_an_empty_string_is_a_value(client: dsp.Client) -> None:
    await client.variable("empty", "")
    assert (await client.assemble()).variables == {"empty": ""}


async def test_a_static_none_means_no_value(client: dsp.Client) -> None:
    await client.variable("cwd", None)
    assert (await client.assemble()).variables == {"cwd": None}


async def test_a_valueless_variable_is_listed_but_fails_only_where_referenced(
    client: dsp.Client,
) -> None:
    await client.variable("cwd", None)
    await client.section("plain", 10, "No reference here.")
    rendered = await client.render()
    assert rendered.prompt.endswith("No reference here.")
    assert rendered.assembly.variables == {"cwd": None}


async def test_disposing_a_variable_removes_it_and_frees_its_name(client: dsp.Client) -> None:
    off = await client.variable("model", "old")
    await off()
    assert (await client.assemble()).variables == {}
    await client.variable("model", "new")
    assert (await client.assemble()).variables == {"model": "new"}


async def test_global_variables_are_listed_in_registration_order(client: dsp.Client) -> None:
    for name in ("zeta", "alpha", "mid"):
        await client.variable(name, name.upper())
    assembly = await client.assemble()
    assert list(assembly.variables.items()) == [
        ("zeta", "ZETA"),
        ("alpha", "ALPHA"),
        ("mid", "MID"),
    ]


async def test_global_variables_of_all_sessions_are_listed_in_registration_order(
    connect: ClientFactory,
) -> None:
    first, second = await connect(), await connect()
    await first.variable("zeta", "1")
    await second.variable("alpha", "2")
    await first.variable("mid", "3")
    assert list((await second.assemble()).variables) == ["zeta", "alpha", "mid"]


async def test_a_scopes_new_names_follow_the_global_names(client: dsp.Client) -> None:
    scope = await client.scope("agent-1")
    await scope.variable("agent_only", "a")
    await client.variable("zeta", "z")
    await client.variable("alpha", "x")
    assembly = await client.assemble(scope="agent-1")
    assert list(assembly.variables.items()) == [("zeta", "z"), ("alpha", "x"), ("agent_only", "a")]


async def test_chain_layers_new_names_are_listed_farthest_layer_first(client: dsp.Client) -> None:
    child = await client.scope("child", parent="parent")
    parent = await client.scope("parent", parent="grandparent")
    grandparent = await client.scope("grandparent")
    await child.variable("from_child", "c")
    await parent.variable("from_parent", "p")
    await grandparent.variable("from_grandparent", "g")
    await client.variable("from_global", "0")
    assembly = await client.assemble(scope="child")
    assert list(assembly.variables) == [
        "from_global",
        "from_grandparent",
        "from_parent",
        "from_child",
    ]


async def test_a_scoped_variable_shadows_a_global_one_in_that_scope(client: dsp.Client) -> None:
    await client.variable("model", "global-model")
    scope = await client.scope("agent-1")
    await scope.variable("model", "agent-model")
    assert (await client.assemble(scope="agent-1")).variables == {"model": "agent-model"}
    assert (await client.assemble()).variables == {"model": "global-model"}


async def test_a_shadowing_variable_keeps_the_shadowed_names_position(client: dsp.Client) -> None:
    for name in ("first", "second", "third"):
        await client.variable(name, f"global {name}")
    scope = await client.scope("agent-1")
    await scope.variable("extra", "agent extra")
    await scope.variable("second", "agent second")
    variables = (await client.assemble(scope="agent-1")).variables
    assert list(variables) == ["first", "second", "third", "extra"]  # "second" where it was
    assert variables["second"] == "agent second"
    assert [variables[n] for n in ("first", "third", "extra")] == [
        "global first",
        "global third",
        "agent extra",
    ]


async def test_a_nearer_layer_shadows_keeping_the_farthest_position(client: dsp.Client) -> None:
    grandparent, parent, child = await chain(client)
    await grandparent.variable("shared", "g")
    await grandparent.variable("g_only", "g")
    await parent.variable("p_only", "p")
    await parent.variable("shared", "p")
    await child.variable("shared", "c")
    await client.variable("global_only", "0")
    assembly = await client.assemble(scope="worker")
    assert list(assembly.variables.items()) == [
        ("global_only", "0"),
        ("shared", "c"),
        ("g_only", "g"),
        ("p_only", "p"),
    ]


async def test_a_scoped_none_shadows_a_global_value(client: dsp.Client) -> None:
    await client.variable("cwd", "/srv")
    scope = await client.scope("agent-1")
    await scope.variable("cwd", None)
    assert (await client.assemble(scope="agent-1")).variables == {"cwd": None}


async def test_disposing_a_shadowing_variable_restores_the_global_value(
    client: dsp.Client,
) -> None:
    await client.variable("model", "global-model")
    scope = await client.scope("agent-1")
    off = await scope.variable("model", "agent-model")
    await off()
    assert (await client.assemble(scope="agent-1")).variables == {"model": "global-model"}
