"""What a rule may cost: each expression's worst case is estimated at registration over
bounded inputs and a rule over `limits.max_rule_cost` is refused RULE_INVALID naming its
dearest expression; the inputs are held to those bounds when it runs (the assembly's lists to
`max_rule_items`, the fields to `max_rule_fields_bytes`, else RULE_FAILED); and a predicate is
judged over any number of items in their order."""

from __future__ import annotations

import re

import dsh_system_prompt as dsp
import grpc
from dsh_system_prompt import FailurePolicy, Mutation, Rule, RulePart
from helpers import ClientOf, failure, rejection, tool, tool_names

from rules.stock import TOOLS, stocked

INVALID = (grpc.StatusCode.INVALID_ARGUMENT, "RULE_INVALID")
FAILED = (grpc.StatusCode.ABORTED, "RULE_FAILED")
_ONCE = re.compile(
    r'rule "(?P<rule>[^"]+)": (?P<path>\S+): one evaluation\'s worst case is estimated at'
    r" (?P<cost>[\d,]+) cost units, over the limit of 5,000,000"
    r" \(limits.max_rule_evaluation_cost; a unit is about a nanosecond\)"
)
_RULE = re.compile(
    r'rule "(?P<rule>[^"]+)": (?P<path>\S+): its worst case is estimated at (?P<cost>[\d,]+)'
    r" cost units, the rule's at (?P<total>[\d,]+), over the limit of 10,000,000"
    r" \(limits.max_rule_cost; a unit is about a nanosecond\)"
)
UNBOUNDED = {"max_rule_cost": 2**31 - 1, "max_rule_evaluation_cost": 2**31 - 1}


async def over_the_limit(
    client: dsp.Client, name: str, rule: Rule, pattern: re.Pattern[str] = _ONCE
) -> tuple[str, int]:
    """The path and cost of the dearest expression `rule` is refused for; nothing is kept."""
    error = await rejection(client.rule(name, rule))
    code, reason, message = failure(error)
    assert (code, reason) == INVALID
    found = pattern.fullmatch(message)
    assert found is not None, message
    assert found["rule"] == name
    assert tool_names(await client.assemble(fields={"a": 1})) == TOOLS  # nothing registered
    return found["path"], int(found["cost"].replace(",", ""))


async def test_string_growth_in_a_comprehension_is_refused(client: dsp.Client) -> None:
    # this one held the event loop for 16-24 s over 64 KB of fields before the estimate
    await stocked(client)
    grows = "fields.l.map(i, fields.s + fields.s).size() > 0"
    path, cost = await over_the_limit(client, "grows", Rule(match=["true", grows]))
    assert path == "match[1]" and cost > 50_000_000


async def test_a_quadratic_replace_is_refused(client: dsp.Client) -> None:
    await stocked(client)
    text = Mutation.upsert_sections(RulePart("s", 1, "fields.s.replace('', fields.s)"))
    path, _ = await over_the_limit(client, "blowup", Rule([Mutation.drop_tools("false"), text]))
    assert path == "mutations[1].upsert_sections[0].text"


async def test_a_predicate_is_costed_for_every_item_it_may_judge(client: dsp.Client) -> None:
    # a tool's description may hold max_tool_schema_bytes, for each of max_rule_items tools
    await stocked(client)
    scan = Mutation.drop_tools("tool.description.contains('web')")
    path, _ = await over_the_limit(client, "scan", Rule([scan]))
    assert path == "mutations[0].drop_tools"


async def test_the_typical_rules_are_admitted(client: dsp.Client) -> None:
    await stocked(client)
    rule = Rule(
        [
            Mutation.drop_tools("tool.name.startsWith('web_')"),
            Mutation.drop_tools("has(fields.agent) && tool.name == fields.agent"),
            Mutation.tool_order(["todo_write"]),
            Mutation.upsert_sections(RulePart("plan", 20, "'Plan: ' + fields.plan")),
        ],
        match=["has(fields.plan)", "fields.tags.exists(t, t == 'admin')"],
    )
    await client.rule("typical", rule)
    assembly = await client.assemble(fields={"plan": "p", "agent": "bash", "tags": ["admin"]})
    assert tool_names(assembly) == ["todo_write", "mcp__github__issue", "mcp__github__pr"]


async def test_a_rule_of_many_admitted_evaluations_is_refused_by_its_total(
    client: dsp.Client,
) -> None:
    # each predicate's evaluations are within the bound (16 tools each), not the 256 tools'
    # eight predicates together in one assembly
    await stocked(client)
    drops = [Mutation.drop_tools(f"tool.name.startsWith('web_{i}')") for i in range(8)]
    path, cost = await over_the_limit(client, "many", Rule(drops), _RULE)
    assert path == "mutations[0].drop_tools" and 1_000_000 < cost < 10_000_000


async def test_a_higher_limit_admits_what_the_default_refuses(client_of: ClientOf) -> None:
    async with client_of(limits=UNBOUNDED) as client:
        await stocked(client)
        await client.rule("scan", Rule([Mutation.drop_tools("tool.description.contains('web')")]))
        assert "web_fetch" not in tool_names(await client.assemble())


async def test_an_assembly_with_more_items_than_the_bound_fails_the_rule(
    client_of: ClientOf,
) -> None:
    async with client_of(limits={"max_rule_items": 4}) as client:
        await stocked(client)  # five tools
        await client.rule("web", Rule([Mutation.drop_tools("tool.name.startsWith('web')")]))
        error = await rejection(client.assemble())
        assert failure(error) == (
            *FAILED,
            'rule "web" failed: assembly: the assembly has 5 tools, over the 4 its rules are'
            " checked for (limits.max_rule_items)",
        )


async def test_a_rule_reading_neither_the_assembly_nor_items_is_not_held_to_it(
    client_of: ClientOf,
) -> None:
    async with client_of(limits={"max_rule_items": 4}) as client:
        await stocked(client)
        await client.rule("plan", Rule([Mutation.upsert_sections(RulePart("p", 20, "'x'"))]))
        assert dsp.AssembledSection("p", "x") in (await client.assemble()).sections


async def test_fields_over_the_bound_fail_a_rule_reading_them(client_of: ClientOf) -> None:
    async with client_of(limits={"max_rule_fields_bytes": 32}) as client:
        await stocked(client)
        rule = Rule([Mutation.drop_tools("tool.name == fields.agent")])
        await client.rule("agent", rule)
        assert "bash" not in tool_names(await client.assemble(fields={"agent": "bash"}))
        error = await rejection(client.assemble(fields={"agent": "bash", "pad": "x" * 32}))
        code, reason, message = failure(error)
        assert (code, reason) == FAILED
        assert message.startswith('rule "agent" failed: fields: the assemble context\'s fields')
        assert message.endswith(
            "over the 32 its rules are checked for (limits.max_rule_fields_bytes)"
        )


async def test_under_ignore_fields_over_the_bound_skip_the_rule(client_of: ClientOf) -> None:
    async with client_of(limits={"max_rule_fields_bytes": 32}) as client:
        await stocked(client)
        rule = Rule(
            [Mutation.drop_tools("tool.name == fields.agent")],
            failure_policy=FailurePolicy.IGNORE,
        )
        await client.rule("agent", rule)
        assert tool_names(await client.assemble(fields={"agent": "bash", "pad": "x" * 32})) == TOOLS


async def test_a_predicate_judges_many_items_in_their_order(client: dsp.Client) -> None:
    # the items are judged in lists of 16 (one flat map over them copies quadratically)
    names = [f"t{i:02d}" for i in range(40)]
    await client.tools([tool(name) for name in names])
    drop = "int(tool.name.substring(1)) % 3 == 0"
    await client.rule("thirds", Rule([Mutation.drop_tools(drop)]))
    assert tool_names(await client.assemble()) == [n for i, n in enumerate(names) if i % 3]


async def test_nested_comprehensions_are_refused_without_walking_each_nesting(
    client: dsp.Client,
) -> None:
    """The estimate walks a comprehension's body up to four times, so nine nested
    `fields.all` (148 bytes) took it over 12 s, the event loop held throughout: past 20,000
    nodes visited the expression is refused as too complex to estimate."""
    await stocked(client)
    nested = "true"
    for number in range(9):
        nested = f"fields.all(v{number}, {nested})"
    error = await rejection(client.rule("nested", Rule(match=[nested])))
    code, reason, message = failure(error)
    assert (code, reason) == INVALID
    assert message == (
        'rule "nested": match[0]: its cost estimate would take over 20,000 steps: nest fewer'
        " comprehensions"
    )
    assert tool_names(await client.assemble(fields={"a": 1})) == TOOLS  # nothing registered
