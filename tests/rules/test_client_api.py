"""The Python client's rules API: `client.rule` and `scope.rule`, the typed builders of
`dsp.Rule`, `dsp.Mutation` and `dsp.RulePart`, what they refuse before sending, and the handle."""

from __future__ import annotations

import dsh_system_prompt as dsp
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt import FailurePolicy, Mutation, Rule, RulePart
from helpers import rejection, tool, tool_names


def test_a_rule_is_sent_as_the_proto_s_rule_spec() -> None:
    rule = Rule(
        [
            Mutation.drop_tools("a"),
            Mutation.keep_tools("b"),
            Mutation.tool_order(["x", "y"]),
            Mutation.upsert_sections(RulePart("s", 1.5, "c")),
            Mutation.upsert_contexts(RulePart("k", -2, "d")),
            Mutation.drop_sections("e"),
            Mutation.drop_contexts("f"),
            Mutation.set_variables({"v": "g", "w": None}),
        ],
        match=["m"],
        variables={"n": "h"},
        failure_policy=FailurePolicy.IGNORE,
    )
    spec = rule.to_proto()
    assert [m.WhichOneof("operation") for m in spec.mutations] == [
        "drop_tools",
        "keep_tools",
        "tool_order",
        "upsert_sections",
        "upsert_contexts",
        "drop_sections",
        "drop_contexts",
        "set_variables",
    ]
    assert spec.mutations[3].upsert_sections.parts[0] == pb.RulePart(name="s", order=1.5, text="c")
    [v, w] = spec.mutations[7].set_variables.variables
    assert (v.expression, w.HasField("unset")) == ("g", True)
    assert (list(spec.match), spec.variables[0].name, spec.failure_policy) == (
        ["m"],
        "n",
        pb.FAILURE_POLICY_IGNORE,
    )


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Rule(match="true"), "a rule's match is a list, not str"),
        (lambda: Rule(["drop"]), "a rule's mutations are made by dsp.Mutation, not str"),
        (lambda: Rule(match=[1]), "a rule's expression must be a str, not int"),
        (lambda: Rule(failure_policy="maybe"), "failure_policy must be dsp.FailurePolicy.FAIL"),
        (
            lambda: Rule([Mutation.upsert_sections(RulePart("s", float("nan"), "'x'"))]),
            "a rule part's order must be finite, not nan",
        ),
    ],
    ids=["match-str", "mutation-str", "expression-int", "policy", "order-nan"],
)
async def test_a_malformed_rule_is_refused_in_the_client(
    client: dsp.Client, make: object, message: str
) -> None:
    async def register() -> None:  # some are refused as built, some as sent
        await client.rule("r", make())  # type: ignore[operator]

    error = await rejection(register())
    assert error.reason == "INVALID_VALUE"
    assert error.message.startswith(message)


async def test_scope_rule_and_the_handle_s_update_and_dispose(client: dsp.Client) -> None:
    await client.tools([tool("bash"), tool("web_fetch")])
    scope = await client.scope("agent")
    handle = await scope.rule("web", Rule([Mutation.drop_tools("tool.name == 'web_fetch'")]))
    assert tool_names(await client.assemble("agent")) == ["bash"]
    assert tool_names(await client.assemble()) == ["bash", "web_fetch"]
    await handle.update(Rule([Mutation.drop_tools("tool.name == 'bash'")]))
    assert tool_names(await client.assemble("agent")) == ["web_fetch"]
    error = await rejection(handle.update("tool.name == 'x'"))
    assert (error.reason, error.message) == ("INVALID_VALUE", "a rule is a dsp.Rule, not str")
    async with handle:
        pass  # leaving the block disposes it, as every disposer
    assert handle.disposed
    assert tool_names(await client.assemble("agent")) == ["bash", "web_fetch"]


async def test_a_rule_s_handle_replaces_only_a_rule(client: dsp.Client) -> None:
    section = await client.section("s", 1, "text")
    error = await rejection(section.update(Rule()))
    assert (error.reason, error.message) == (
        "INVALID_VALUE",
        "the new text must be a str, not Rule",
    )
