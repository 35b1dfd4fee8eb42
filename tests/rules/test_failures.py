"""A rule that fails at assembly: under FAIL the assembly is ABORTED RULE_FAILED naming the
rule and the expression; under IGNORE the rule is passed over and named in `skipped`; the
iteration budget bounds one evaluation."""

from __future__ import annotations

import dsh_system_prompt as dsp
import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt import FailurePolicy, Mutation, Rule, RulePart
from helpers import ClientOf, failure, rejection, tool_names

from rules.stock import TOOLS, stocked

FAILED = (grpc.StatusCode.ABORTED, "RULE_FAILED")
# 101 x 100 iterations: one more than an evaluation's budget of 10,000
# the cost bounds as high as they go: what the budget alone stops
UNBOUNDED = {"max_rule_cost": 2**31 - 1, "max_rule_evaluation_cost": 2**31 - 1}
OVER_BUDGET = "[" + ",".join(["1"] * 101) + "].all(x, [" + ",".join(["1"] * 100) + "].all(y, true))"


async def test_a_missing_field_fails_the_assembly_naming_rule_and_expression(
    client: dsp.Client,
) -> None:
    await stocked(client)
    await client.rule("agent", Rule([Mutation.drop_tools("tool.name == fields.agent")]))
    error = await rejection(client.assemble())
    assert failure(error) == (
        *FAILED,
        'rule "agent" failed: mutations[0].drop_tools: Key not found in map : "agent"',
    )
    assert "bash" not in tool_names(await client.assemble(fields={"agent": "bash"}))


async def test_a_dyn_value_of_the_wrong_type_fails_at_run_time(client: dsp.Client) -> None:
    await stocked(client)
    text = Mutation.upsert_sections(RulePart("n", 1, "fields.n"))  # dyn: checked when run
    await client.rule("count", Rule([text]))
    error = await rejection(client.assemble(fields={"n": 3}))
    assert failure(error) == (
        *FAILED,
        'rule "count" failed: mutations[0].upsert_sections[0].text: wants a string, the value'
        " is an int",
    )
    assembly = await client.assemble(fields={"n": "three"})
    assert assembly.sections[2] == dsp.AssembledSection("n", "three")


async def test_a_failing_variable_is_named_where_it_is_evaluated(client: dsp.Client) -> None:
    await stocked(client)
    rule = Rule([Mutation.drop_tools("tool.name == variables.who")], variables={"who": "fields.x"})
    await client.rule("var", rule)
    error = await rejection(client.assemble())
    assert error.message == 'rule "var" failed: variables.who: Key not found in map : "x"'


async def test_the_iteration_budget_fails_an_evaluation_that_needs_more(
    client_of: ClientOf,
) -> None:
    # the cost bound refuses this under the defaults (tests/rules/test_cost.py)
    async with client_of(limits=UNBOUNDED) as client:
        await stocked(client)
        await client.rule("heavy", Rule(match=[OVER_BUDGET]))
        error = await rejection(client.assemble())
        assert failure(error) == (
            *FAILED,
            'rule "heavy" failed: match[0]: over the budget of 10,000 iterations of one evaluation',
        )


async def test_a_predicate_shares_one_budget_over_all_its_items(client_of: ClientOf) -> None:
    # a cost limit far above the default's: this predicate is refused under it (test_cost.py)
    async with client_of(limits={**UNBOUNDED, "max_rule_items": 5}) as client:
        await stocked(client)
        # 5 tools x 2,001 iterations each: over the budget together, not one by one
        inner = "[" + ",".join(["1"] * 2001) + "].exists(x, x == 2)"
        await client.rule("per-tool", Rule([Mutation.drop_tools(inner)]))
        error = await rejection(client.assemble())
        assert error.message.endswith("over the budget of 10,000 iterations of one evaluation")


async def test_under_ignore_a_failing_rule_is_skipped_and_named(client: dsp.Client) -> None:
    await stocked(client)
    rule = Rule(
        [Mutation.drop_tools("true"), Mutation.drop_sections("section.name == fields.gone")],
        failure_policy=FailurePolicy.IGNORE,
    )
    handle = await client.rule("decorate", rule)
    assembly = await client.assemble()
    assert tool_names(assembly) == TOOLS  # none of its mutations stands, not even the first
    [step] = assembly.skipped
    assert (step.kind, step.name, step.scope, step.reason, step.message) == (
        "rule",
        "decorate",
        None,
        "RULE_FAILED",
        'rule "decorate" failed: mutations[1].drop_sections: Key not found in map : "gone"',
    )
    assert step.ref
    assert tool_names(await client.assemble(fields={"gone": "x"})) == []
    await handle()


async def test_an_ignored_rule_is_named_in_the_skipped_trailer(
    client: dsp.Client, stub: object
) -> None:
    await client.rule("ignored", Rule(match=["fields.x"], failure_policy=FailurePolicy.IGNORE))
    call = stub.Assemble(pb.AssembleRequest())  # type: ignore[attr-defined]
    response = await call
    trailer = dict(await call.trailing_metadata())["dsh-skipped-steps"]
    assert trailer.startswith("rule:") and trailer.endswith(":RULE_FAILED")
    assert [step.kind for step in response.skipped] == [pb.CHANGE_KIND_RULE]


async def test_a_text_over_the_limit_fails_the_rule(client_of: object) -> None:
    async with client_of(limits={"max_text_bytes": 16}) as client:  # type: ignore[operator]
        await client.rule("big", Rule([Mutation.upsert_sections(RulePart("big", 1, "fields.t"))]))
        error = await rejection(client.assemble(fields={"t": "x" * 20}))
        assert failure(error) == (
            *FAILED,
            'rule "big" failed: mutations[0].upsert_sections[0].text: the text of "big" is 20'
            " bytes, over the limit of 16",
        )
