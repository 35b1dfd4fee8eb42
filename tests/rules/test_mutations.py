"""Each operation of a rule on a real sidecar, its match and its variables."""

from __future__ import annotations

import dsh_system_prompt as dsp
from dsh_system_prompt import Mutation, Rule, RulePart
from helpers import ClientOf, context_names, section_names, tool_names

from rules.stock import TOOLS, stocked


async def test_drop_tools_removes_those_its_predicate_holds_for(client: dsp.Client) -> None:
    await stocked(client)
    await client.rule("no-mcp", Rule([Mutation.drop_tools("tool.name.startsWith('mcp__')")]))
    assert tool_names(await client.assemble()) == ["bash", "todo_write", "web_fetch"]


async def test_keep_tools_keeps_only_those_its_predicate_holds_for(client: dsp.Client) -> None:
    await stocked(client)
    rule = Rule([Mutation.keep_tools("tool.name in ['bash', 'web_fetch']")])
    await client.rule("allow", rule)
    assert tool_names(await client.assemble()) == ["bash", "web_fetch"]


async def test_a_predicate_reads_the_fields(client_of: ClientOf) -> None:
    # a list in the fields looked through for every tool is refused under the default bounds
    # (its worst case is tools x entries, tests/rules/test_cost.py): smaller fields admit it
    async with client_of(limits={"max_rule_fields_bytes": 64}) as client:
        await stocked(client)
        deny = "'deny' in fields && tool.name in fields.deny"
        await client.rule("deny", Rule([Mutation.drop_tools(deny)]))
        assembly = await client.assemble(fields={"deny": ["bash", "todo_write"]})
        assert tool_names(assembly) == ["mcp__github__issue", "mcp__github__pr", "web_fetch"]
        assert tool_names(await client.assemble()) == TOOLS


async def test_tool_order_puts_the_named_first_and_keeps_the_rest_in_order(
    client: dsp.Client,
) -> None:
    await stocked(client)
    await client.rule("order", Rule([Mutation.tool_order(["web_fetch", "ghost", "bash"])]))
    assert tool_names(await client.assemble()) == [
        "web_fetch",
        "bash",
        "mcp__github__issue",
        "mcp__github__pr",
        "todo_write",
    ]


async def test_upsert_places_a_new_section_by_order_and_replaces_in_place(
    client: dsp.Client,
) -> None:
    await stocked(client)
    upsert = Mutation.upsert_sections(
        RulePart("middle", 20, "'Agent ' + fields.agent + '.'"),
        RulePart("intro", 99, "'Hi.'"),  # exists: new text, same place (the order is unused)
        RulePart("first", -5, "'First.'"),
    )
    await client.rule("agent", Rule([upsert], match=["'agent' in fields"]))
    assembly = await client.assemble(fields={"agent": "ada"})
    assert [(s.name, s.text) for s in assembly.sections] == [
        ("harness:identity", "You are an AI agent powered by DeepSeek Harness."),
        ("first", "First."),  # -5: after the identity's -100, before the persona's 0
        (dsp.PERSONA_SECTION, ""),
        ("intro", "Hi."),
        ("middle", "Agent ada."),
        ("outro", "Bye."),
    ]


async def test_upsert_contexts_and_drop_contexts(client: dsp.Client) -> None:
    await stocked(client)
    add = Mutation.upsert_contexts(RulePart("cwd", 5, "fields.cwd"))
    await client.rule("cwd", Rule([add], match=["'cwd' in fields"]))
    assembly = await client.assemble(fields={"cwd": "/src"})
    assert [(c.name, c.text) for c in assembly.contexts] == [("cwd", "/src"), ("clock", "noon")]
    await client.rule("no-clock", Rule([Mutation.drop_contexts("context.name == 'clock'")]))
    assert context_names(await client.assemble(fields={"cwd": "/src"})) == ["cwd"]


async def test_drop_sections_removes_those_its_predicate_holds_for(client: dsp.Client) -> None:
    await stocked(client)
    await client.rule("quiet", Rule([Mutation.drop_sections("section.text in ['Hello.', 'Bye.']")]))
    assert section_names(await client.assemble()) == ["harness:identity", dsp.PERSONA_SECTION]


async def test_set_variables_sets_a_value_or_no_value(client: dsp.Client) -> None:
    await stocked(client)
    values = {"model": "fields.model.upperAscii()", "who": None, "lang": "'en'"}
    await client.rule("vars", Rule([Mutation.set_variables(values)]))
    assembly = await client.assemble(fields={"model": "r1"})
    assert assembly.variables == {"model": "R1", "who": None, "lang": "en"}
    assert list(assembly.variables) == ["model", "who", "lang"]  # a known name keeps its place


async def test_mutations_apply_in_order_each_on_what_the_one_before_left(
    client: dsp.Client,
) -> None:
    await stocked(client)
    rule = Rule(
        [
            Mutation.upsert_sections(RulePart("count", 50, "'two'")),
            Mutation.drop_sections("section.text == 'two'"),  # sees the part just added
            Mutation.drop_tools("tool.name != 'bash'"),
            Mutation.tool_order(["web_fetch"]),  # gone already: passed over
        ]
    )
    await client.rule("steps", rule)
    assembly = await client.assemble()
    assert "count" not in section_names(assembly)
    assert tool_names(assembly) == ["bash"]


async def test_a_false_match_leaves_the_assembly_and_all_true_applies(
    client: dsp.Client,
) -> None:
    await stocked(client)
    rule = Rule(
        [Mutation.drop_tools("true")],
        match=["'agent' in fields", "fields.agent == 'reviewer'", "scope == ''"],
    )
    await client.rule("reviewer", rule)
    assert tool_names(await client.assemble(fields={"agent": "coder"})) == TOOLS
    assert tool_names(await client.assemble()) == TOOLS  # the second is never evaluated
    assert tool_names(await client.assemble(fields={"agent": "reviewer"})) == []


async def test_match_reads_the_assembly_the_scope_and_its_chain(client: dsp.Client) -> None:
    await stocked(client)
    team = await client.scope("team")
    await client.scope("agent-1", parent="team")
    rule = Rule(
        [Mutation.drop_tools("tool.name == 'bash'")],
        match=["'team' in scope_chain", "assembly.tools.exists(t, t.name == 'bash')"],
    )
    await team.rule("no-bash-in-team", rule)
    assert "bash" not in tool_names(await client.assemble("agent-1"))
    assert "bash" in tool_names(await client.assemble())


async def test_variables_are_shared_and_see_those_before_them(client: dsp.Client) -> None:
    await stocked(client)
    rule = Rule(
        [
            Mutation.drop_tools("tool.name.startsWith(variables.prefix)"),
            Mutation.upsert_sections(RulePart("note", 40, "'dropped ' + variables.prefix")),
        ],
        variables={"server": "fields.server", "prefix": "'mcp__' + variables.server + '__'"},
    )
    await client.rule("mcp-server", rule)
    assembly = await client.assemble(fields={"server": "github"})
    assert tool_names(assembly) == ["bash", "todo_write", "web_fetch"]
    assert assembly.sections[-1] == dsp.AssembledSection("note", "dropped mcp__github__")


async def test_a_variable_no_expression_reads_is_never_evaluated(client: dsp.Client) -> None:
    await stocked(client)
    # `missing` fails when evaluated (no such field): the rule works while nothing needs it
    rule = Rule(
        [Mutation.drop_tools("tool.name == 'bash'")],
        variables={"missing": "fields.nowhere", "unused": "1 / 0"},
    )
    await client.rule("lazy", rule)
    assert "bash" not in tool_names(await client.assemble())
