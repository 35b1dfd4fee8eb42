"""Prompt-cache reports name the rule that removed, changed or added a part, as they name a
listener: its step is a step of the trace, of kind rule."""

from __future__ import annotations

import dsh_system_prompt as dsp
from dsh_system_prompt import Mutation, Rule, RulePart
from helpers import report_of

from rules.stock import stocked


async def stability(client: dsp.Client, **fields: object) -> dsp.PrefixStability:
    return (await report_of(client, None, **fields)).stability


async def test_a_tool_a_rule_drops_is_named_with_the_rule(client: dsp.Client) -> None:
    await stocked(client)
    drop = Mutation.drop_tools("has(fields.drop) && tool.name == 'web_fetch'")
    await client.rule("no-web", Rule([drop]))
    await stability(client)
    after = await stability(client, drop=True)
    assert (after.first_changed, after.reason) == (
        'tool "web_fetch"',
        'tool "web_fetch" removed (by rule "no-web")',
    )


async def test_a_section_a_rule_rewrites_is_blamed_on_the_rule(client: dsp.Client) -> None:
    await stocked(client)
    rewrite = Mutation.upsert_sections(RulePart("intro", 10, "'Hi ' + fields.who + '.'"))
    await client.rule("greeter", Rule([rewrite], match=["has(fields.who)"]))
    await stability(client, who="ann")
    after = await stability(client, who="bob")
    assert (after.first_changed, after.reason) == (
        'section "intro"',
        'rule "greeter" changed section "intro"',
    )


async def test_a_section_a_rule_adds_is_named_with_the_rule(client: dsp.Client) -> None:
    await stocked(client)
    note = Mutation.upsert_sections(RulePart("note", 20, "fields.note"))
    await client.rule("noter", Rule([note], match=["has(fields.note)"]))
    await stability(client)
    after = await stability(client, note="Be brief.")
    assert after.first_changed == 'section "note"'
    assert after.reason.startswith('section "note" added before ')
    assert after.reason.endswith(' (by rule "noter")')
