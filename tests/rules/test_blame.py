"""Prompt-cache reports name the rule that removed, changed or added a part, as they name a
listener: its step is a step of the trace, of kind rule."""

from __future__ import annotations

from collections.abc import Mapping

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt import Mutation, Rule, RulePart
from helpers import report_of

from rules.stock import stocked


async def stability_after(
    client: dsp.Client, name: str, rule: Rule, before: Mapping[str, object], **after: object
) -> dsp.PrefixStability:
    """The report's stability once `rule` holds and the fields go from `before` to `after`."""
    await stocked(client)
    await client.rule(name, rule)
    await report_of(client, None, **before)
    return (await report_of(client, None, **after)).stability


NO_WEB = Rule([Mutation.drop_tools("has(fields.drop) && tool.name == 'web_fetch'")])
GREETER = Rule(
    [Mutation.upsert_sections(RulePart("intro", 10, "'Hi ' + fields.who + '.'"))],
    match=["has(fields.who)"],
)


@pytest.mark.parametrize(
    ("name", "rule", "before", "after", "first", "blame"),
    [
        (
            "no-web",
            NO_WEB,
            {},
            {"drop": True},
            'tool "web_fetch"',
            'tool "web_fetch" removed (by rule "no-web")',
        ),
        (
            "greeter",
            GREETER,
            {"who": "ann"},
            {"who": "bob"},
            'section "intro"',
            'rule "greeter" changed section "intro"',
        ),
    ],
    ids=["a-tool-it-drops", "a-section-it-rewrites"],
)
async def test_a_part_a_rule_removes_or_rewrites_is_blamed_on_the_rule(
    client: dsp.Client,
    name: str,
    rule: Rule,
    before: dict[str, object],
    after: dict[str, object],
    first: str,
    blame: str,
) -> None:
    stability = await stability_after(client, name, rule, before, **after)
    assert (stability.first_changed, stability.reason) == (first, blame)


async def test_a_section_a_rule_adds_is_named_with_the_rule(client: dsp.Client) -> None:
    note = Mutation.upsert_sections(RulePart("note", 20, "fields.note"))
    noter = Rule([note], match=["has(fields.note)"])
    after = await stability_after(client, "noter", noter, {}, note="Be brief.")
    assert after.first_changed == 'section "note"'
    assert after.reason.startswith('section "note" added before ')
    assert after.reason.endswith(' (by rule "noter")')
