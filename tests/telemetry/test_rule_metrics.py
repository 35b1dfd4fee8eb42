"""Per-rule metrics: each rule's runs by outcome, labelled by rule and scope, over a real
sidecar's /metrics; a disposed rule's series go with it, so a churn of rule names leaves
the metric set no bigger."""

from __future__ import annotations

import dsh_system_prompt as dsp
from dsh_system_prompt import FailurePolicy, Mutation, Rule
from helpers import ClientOf, SidecarFactory, rejection
from processes import free_port

from telemetry.test_operability import scrape

RUNS = "dsp_rule_evaluations_total"


def series(text: str) -> dict[str, float]:
    """The rule-run series of a scrape: label text -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith(RUNS + "{"):
            labels, value = line.rsplit(" ", 1)
            found[labels[len(RUNS) :]] = float(value)
    return found


async def test_each_rule_s_runs_are_counted_by_outcome(client_of: ClientOf) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with client_of(metrics_listen=address, metrics_key_labels=True) as client:
        await client.rule("trim", Rule([Mutation.drop_tools("tool.name == 'x'")]))
        scope = await client.scope("agent")
        await scope.rule("quiet", Rule(match=["fields.x"], failure_policy=FailurePolicy.IGNORE))
        strict = await client.rule("strict", Rule(match=["fields.y == 'go'"]))
        await client.assemble("agent", fields={"y": "go", "x": True})  # all three ok
        await client.assemble("agent", fields={"y": "stop"})  # quiet skipped (no x)
        await rejection(client.assemble(fields={"n": 1}))  # strict fails (no y)
        text = await scrape(address)
        await strict()
        after = await scrape(address)
    assert series(text) == {
        '{outcome="ok",rule="trim",scope="global"}': 3.0,
        '{outcome="ok",rule="quiet",scope="agent"}': 1.0,
        '{outcome="skipped",rule="quiet",scope="agent"}': 1.0,
        '{outcome="ok",rule="strict",scope="global"}': 2.0,
        '{outcome="failed",rule="strict",scope="global"}': 1.0,
    }
    assert not any('rule="strict"' in labels for labels in series(after))


async def test_scope_keys_label_rules_only_when_asked_to(client_of: ClientOf) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with client_of(metrics_listen=address) as client:
        scope = await client.scope("secret-customer-agent")
        await scope.rule("r", Rule())
        await client.assemble("secret-customer-agent")
        text = await scrape(address)
    assert "secret-customer-agent" not in text
    assert series(text) == {'{outcome="ok",rule="r",scope=""}': 1.0}


async def test_a_churn_of_rule_names_leaves_no_series_behind(client_of: ClientOf) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with client_of(metrics_listen=address) as client:
        await client.rule("kept", Rule())
        for round_ in range(30):
            handle = await client.rule(f"churn-{round_}", Rule())
            await client.assemble(fields={"round": round_})  # fields: no kept answer serves it
            await handle()
        text = await scrape(address)
    # 31 rules ran; only the live one has a series
    assert series(text) == {'{outcome="ok",rule="kept",scope="global"}': 30.0}


async def test_a_rule_gone_with_its_session_takes_its_series(
    make_sidecar: SidecarFactory,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    sidecar = await make_sidecar(metrics_listen=address)
    async with dsp.connect(sidecar.address) as client:
        async with dsp.connect(sidecar.address) as other:
            await other.rule("theirs", Rule())
            await client.assemble()
            assert 'rule="theirs"' in await scrape(address)
        await client.assemble(fields={"after": True})
        text = await scrape(address)
    assert 'rule="theirs"' not in text
