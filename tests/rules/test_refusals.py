"""A rule is checked when it is registered: each refusal, its status, reason and message
naming the rule and the expression, and nothing registered after it."""

from __future__ import annotations

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt import Mutation, Rule, RulePart
from helpers import ClientOf, SidecarFactory, failure, rejection, tool_names

from rules.stock import TOOLS, stocked

INVALID = (grpc.StatusCode.INVALID_ARGUMENT, "RULE_INVALID")


async def refused(client: dsp.Client, rule: Rule, name: str = "r") -> str:
    """The RULE_INVALID message `rule` is refused with; the assembly is unchanged after it."""
    if not tool_names(await client.assemble()):
        await stocked(client)
    error = await rejection(client.rule(name, rule))
    code, reason, message = failure(error)
    assert (code, reason) == INVALID
    assert tool_names(await client.assemble(fields={"a": 1})) == TOOLS  # nothing registered
    return message


async def test_a_typo_in_a_field_is_refused_with_cel_s_message_and_position(
    client: dsp.Client,
) -> None:
    rule = Rule([Mutation.keep_tools("true"), Mutation.drop_tools("tool.nme.startsWith('w')")])
    assert await refused(client, rule, "no-web") == (
        "rule \"no-web\": mutations[1].drop_tools:1:5: undefined field 'nme' not found in struct"
        " 'dsh.systemprompt.v1.ToolSchema'\n | tool.nme.startsWith('w')\n | ....^"
    )


async def test_a_syntax_error_is_refused_at_its_position(client: dsp.Client) -> None:
    message = await refused(client, Rule(match=["true", "fields.a =="]))
    assert message.startswith('rule "r": match[1]:1:12: Syntax error: ')
    assert message.endswith(" | fields.a ==\n | ...........^")


async def test_an_undeclared_name_is_refused(client: dsp.Client) -> None:
    message = await refused(client, Rule(match=["variables.nope == 'x'"]))
    assert message.startswith(
        "rule \"r\": match[0]:1:1: undeclared reference to 'variables.nope' ("
    )


async def test_an_expression_of_the_wrong_type_for_its_place_is_refused(
    client: dsp.Client,
) -> None:
    assert await refused(client, Rule(match=["'yes'"])) == (
        'rule "r": match[0]: wants a bool, the expression is a string'
    )
    text = Mutation.upsert_sections(RulePart("s", 1, "42"))
    assert await refused(client, Rule([text])) == (
        'rule "r": mutations[0].upsert_sections[0].text: wants a string, the expression is a int'
    )


async def test_a_predicate_names_only_its_own_item(client: dsp.Client) -> None:
    message = await refused(client, Rule([Mutation.drop_sections("tool.name == 'x'")]))
    assert message.startswith(
        "rule \"r\": mutations[0].drop_sections:1:5: undeclared reference to 'tool.name'"
    )


async def test_a_variable_sees_only_those_declared_before_it(client: dsp.Client) -> None:
    rule = Rule(variables={"a": "variables.b", "b": "'x'"})
    message = await refused(client, rule)
    assert message.startswith("rule \"r\": variables.a:1:1: undeclared reference to 'variables.b'")


async def test_a_bad_variable_name_is_refused(client: dsp.Client) -> None:
    assert await refused(client, Rule(variables={"Bad": "1"})) == (
        'rule "r": variables.Bad: invalid variable name "Bad" (must match /^[a-z][a-z0-9_]*$/)'
    )
    values = Mutation.set_variables({"ok": "'x'", "no-dash": "'y'"})
    assert await refused(client, Rule([values])) == (
        'rule "r": mutations[0].set_variables[1].name: invalid variable name "no-dash"'
        " (must match /^[a-z][a-z0-9_]*$/)"
    )


async def test_bad_upserts_and_orders_are_refused(client: dsp.Client) -> None:
    empty = Mutation.upsert_sections(RulePart("", 1, "'x'"))
    assert await refused(client, Rule([empty])) == (
        'rule "r": mutations[0].upsert_sections[0].name: part names must be non-empty'
    )
    twice = Mutation.upsert_contexts(RulePart("a", 1, "'x'"), RulePart("a", 2, "'y'"))
    assert await refused(client, Rule([twice])) == (
        'rule "r": mutations[0].upsert_contexts[1].name: "a" is upserted twice'
    )
    assert await refused(client, Rule([Mutation.tool_order(["a", "a"])])) == (
        'rule "r": mutations[0].tool_order: lists a tool twice'
    )


async def test_a_mutation_without_an_operation_is_refused(client: dsp.Client) -> None:
    empty = Mutation(pb.RuleMutation())
    assert await refused(client, Rule([empty])) == (
        'rule "r": mutations[0]: a mutation needs one operation'
    )


async def test_an_empty_expression_is_refused(client: dsp.Client) -> None:
    assert await refused(client, Rule(match=["  "])) == (
        'rule "r": match[0]: the expression is empty'
    )


async def test_an_expression_over_the_byte_limit_is_refused(client_of: ClientOf) -> None:
    async with client_of(limits={"max_rule_expression_bytes": 64}) as client:
        long = "fields.a == '" + "x" * 60 + "'"
        assert await refused(client, Rule(match=["true", long])) == (
            'rule "r": match[1]: the expression is 74 bytes, over the limit of 64'
            " (limits.max_rule_expression_bytes)"
        )


async def test_a_rule_over_the_expression_count_is_refused(client_of: ClientOf) -> None:
    async with client_of(limits={"max_rule_expressions": 3}) as client:
        assert await refused(client, Rule(match=["true"] * 4)) == (
            'rule "r": more than 3 expressions (limits.max_rule_expressions)'
        )


async def test_nesting_over_the_parser_s_depth_is_refused(client: dsp.Client) -> None:
    deep = "(" * 40 + "true" + ")" * 40
    message = await refused(client, Rule(match=[deep]))
    assert message.startswith('rule "r": match[0]: ')
    assert "recursion" in message


@pytest.mark.parametrize(
    ("name", "code", "reason", "message"),
    [
        ("", "INVALID_ARGUMENT", "INVALID_NAME", "rule names must be non-empty"),
        (
            "n" * 300,
            "INVALID_ARGUMENT",
            "VALUE_TOO_LARGE",
            "rule name is 300 bytes, over the limit of 256",
        ),
    ],
    ids=["empty", "too-long"],
)
async def test_a_bad_rule_name_is_refused(
    client: dsp.Client, name: str, code: str, reason: str, message: str
) -> None:
    error = await rejection(client.rule(name, Rule()))
    assert (error.code.name, error.reason, error.message) == (code, reason, message)


async def test_a_name_is_unique_among_the_rules_of_its_layer(client: dsp.Client) -> None:
    await client.rule("one", Rule())
    error = await rejection(client.rule("one", Rule()))
    assert failure(error) == (
        grpc.StatusCode.ALREADY_EXISTS,
        "DUPLICATE_NAME",
        'rule "one" is already registered',
    )
    scope = await client.scope("team")
    await scope.rule("one", Rule())  # another layer
    error = await rejection(scope.rule("one", Rule()))
    assert error.message == 'rule "one" is already registered in this scope'


async def test_the_rule_counts_are_bounded(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar(limits={"max_rules": 3, "max_rules_per_session": 2})
    async with dsp.connect(sidecar.address) as client, dsp.connect(sidecar.address) as other:
        await client.rule("a", Rule())
        await client.rule("b", Rule())
        error = await rejection(client.rule("c", Rule()))
        assert failure(error) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "QUOTA_EXCEEDED",
            "this session already has 2 rules, the limit per session"
            " (limits.max_rules_per_session)",
        )
        await other.rule("c", Rule())
        error = await rejection(other.rule("d", Rule()))
        assert error.message == "the sidecar already has 3 rules, its limit (limits.max_rules)"


async def test_a_value_that_is_no_rule_is_refused_in_the_client(client: dsp.Client) -> None:
    error = await rejection(client.rule("r", "drop everything"))  # type: ignore[arg-type]
    assert (error.reason, error.message) == (
        "INVALID_VALUE",
        "a rule is a dsp.Rule, not str",
    )
