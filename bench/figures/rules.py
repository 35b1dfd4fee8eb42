"""Rules: waterfall steps the sidecar runs itself (issue 33), side by side with the static
assemble they change, in bidi round trips; the same with unchanged inputs; the dearest rule
the cost bound admits, and other callers beside it; the memory rules take.

Every timed call but the cached figure's sends fields that change from call to call (a
counter), so no kept answer serves it. Each rule does what a bench listener does (docs
show them side by side, docs/protocol.md "Rules").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import dsh_system_prompt as dsp
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt import Mutation, Rule, RulePart
from dsh_system_prompt_server.registry import Limits, RegistryError
from dsh_system_prompt_server.registry.rules import compile_rule

from .. import procs
from ..report import Figure, at_most
from ..stats import Operation, Samples, ratio
from ..targets import TARGETS
from .build import figure, p50_ratio
from .callbacks import over_static
from .harness import OWN_CONNECTION, Harness, Probe

# What before_next's listener does (callbacks.py), as a rule: a section when a field has one.
NOTE_RULE = Rule(
    [Mutation.upsert_sections(RulePart("rule:note", 1000, "fields.note"))],
    match=["has(fields.note)"],
)


def ten_rules() -> dict[str, Rule]:
    """Ten typical rules over the realistic load (tools tool_00..tool_39, sections
    plugin-NN:rules, contexts runtime-NN): drop by prefix, by field, order, upsert, set."""
    return {
        "no-3x": Rule([Mutation.drop_tools("tool.name.startsWith('tool_3')")]),
        "deny": Rule([Mutation.drop_tools("has(fields.deny) && tool.name == fields.deny")]),
        "first": Rule([Mutation.tool_order(["tool_05", "tool_01"])]),
        "note": NOTE_RULE,
        "user": Rule([Mutation.set_variables({"user": "fields.user"})], match=["has(fields.user)"]),
        "keep": Rule([Mutation.keep_tools("!tool.name.endsWith('_99')")]),
        "obsolete": Rule([Mutation.drop_sections("section.name.startsWith('obsolete:')")]),
        "turn": Rule(
            [Mutation.upsert_contexts(RulePart("rule:turn", 100, "'turn ' + string(fields.n)"))]
        ),
        "hide": Rule(
            [Mutation.drop_contexts("context.name == fields.hide")],
            match=["scope_chain.exists(s, s == 'rules-10')", "has(fields.hide)"],
        ),
        "plan-mode": Rule(
            [Mutation.upsert_sections(RulePart("rule:plan", 5, "'Plan first.'"))],
            match=["has(fields.mode) && fields.mode == 'plan'"],
        ),
    }


def _fields(count: itertools.count[int]) -> str:
    n = next(count)
    return json.dumps(
        {"n": n, "note": f"Note {n}.", "deny": "tool_07", "user": "u", "hide": "runtime-03"}
    )


def assemble_with(probe: Probe, scope: str, fields: Callable[[], str]) -> Operation:
    """Assemble `scope` rendered, with the fields `fields()` gives at each call."""
    stub = pb_grpc.SystemPromptServiceStub(probe.channel)

    async def call() -> object:
        context = pb.AssembleContext(scope=scope, fields_json=fields())
        return await stub.Assemble(pb.AssembleRequest(context=context, render=True))

    return call


async def rules(h: Harness) -> list[Figure]:
    """rule_step, rules_10 and rules_10_cached, side by side with the static assemble."""
    client = await dsp.connect(h.sidecar.address, client_name="bench-rules")
    probe = Probe.open(h.sidecar.address)
    count = itertools.count()
    changing = lambda: _fields(count)  # noqa: E731
    unchanged = _fields(itertools.count())
    try:
        await (await client.scope("rule-step")).rule("note", NOTE_RULE)
        ten = await client.scope("rules-10")
        for name, rule in ten_rules().items():
            await ten.rule(name, rule)
        samples = await h.timed_with_round_trip(
            {
                "static": assemble_with(probe, "", changing),
                "rule_step": assemble_with(probe, "rule-step", changing),
                "rules_10": assemble_with(probe, "rules-10", changing),
                "static_unchanged": assemble_with(probe, "", lambda: unchanged),
                "rules_10_cached": assemble_with(probe, "rules-10", lambda: unchanged),
            },
            1000,
        )
    finally:
        await client.close()
        await probe.close()
    words = "≤ {:g} round trips"
    what = "the rule(s)"
    return [
        over_static(samples, "rule_step", "rule: a section when a field has a value", words, what),
        over_static(samples, "rules_10", "ten typical rules, fields changing", words, what),
        p50_ratio(
            {k: samples[k] for k in ("static_unchanged", "rules_10_cached")},
            "rules_10_cached",
            "static_unchanged",
            TARGETS["rules_10_cached"],
            key="rules_10_cached",
            name="ten typical rules, unchanged inputs / static assemble, unchanged inputs",
            details={"fields": unchanged},
        ),
    ]


# --- the dearest rule the bounds admit ----------------------------------------------------

WORST_SCOPE = "rule-worst"


def _worst_fields(agent_count: int) -> dict[str, Any]:
    """Fields at their bound (limits.max_rule_fields_bytes): agents that match no tool and
    a list of ints the rule's match looks through to its end."""
    limit = Limits().max_rule_fields_bytes
    fields: dict[str, Any] = {f"agent{i}": f"agent-{i}" for i in range(agent_count)}
    fields["n"] = 10**9  # room for the counter each call sets
    fields["tags"] = []
    while len(json.dumps(fields, separators=(",", ":"))) + 2 <= limit:
        fields["tags"].append(0)
    return fields


def worst_rule() -> tuple[Rule, int, int]:
    """The rule: a match over every entry of a list in the fields, then as many drop_tools
    comparing each tool's name with a field as the limit admits; its estimate and the
    limit (limits.max_rule_cost)."""
    limits = Limits()
    match = ["!fields.tags.exists(t, t == 1)"]
    chosen: Rule | None = None
    last_cost = 0
    for drops in range(1, limits.max_rule_expressions):
        mutations = [Mutation.drop_tools(f"tool.name == fields.agent{i}") for i in range(drops)]
        rule = Rule(mutations, match=match)
        try:
            cost = compile_rule("worst", rule.to_proto(), limits).cost
        except RegistryError:  # over the limit: the previous one is the dearest
            break
        chosen, last_cost = rule, cost
    assert chosen is not None
    return chosen, last_cost, limits.max_rule_cost


async def rule_worst(h: Harness) -> list[Figure]:
    """The dearest rule the cost bound admits over inputs at their bounds (256 tools with
    names of 256 bytes, fields at limits.max_rule_fields_bytes): its time per assembly over
    the static assemble of the same scope; and four other callers' p99 while one caller
    assembles with it, against the same four alone (calm), in the same run."""
    limits = Limits()
    rule, estimate, limit = worst_rule()
    client = await dsp.connect(h.sidecar.address, client_name="bench-rule-worst")
    probe = Probe.open(h.sidecar.address)
    try:
        scope = await client.scope(WORST_SCOPE)
        have = h.load.tool_count
        names = [f"worst_{i:03d}_" + "x" * (limits.max_name_bytes - 11) for i in range(256 - have)]
        await scope.tools([dsp.ToolSchema(name, "a tool", {"type": "object"}) for name in names])
        fields = _worst_fields(len(rule.mutations))
        counter = itertools.count()

        def worst_fields() -> str:
            fields["n"] = next(counter)  # a key of its own: the rule reads none of it
            return json.dumps(fields, separators=(",", ":"))

        plain = await client.scope(WORST_SCOPE + "-static")
        await plain.tools([dsp.ToolSchema(name, "a tool", {"type": "object"}) for name in names])
        await scope.rule("worst", rule)
        per_call = await h.timed(
            {
                "static": assemble_with(probe, WORST_SCOPE + "-static", worst_fields),
                "worst": assemble_with(probe, WORST_SCOPE, worst_fields),
            },
            200,
        )
        seconds = h.budget.seconds(8.0)
        # the dear caller on a connection of its own, as another client would be (one
        # connection's calls share one client's turns, guard/shares.py)
        dear = Probe.open(h.sidecar.address, OWN_CONNECTION)
        try:
            calm = await _others(h.sidecar.address, seconds, None)
            worst = assemble_with(dear, WORST_SCOPE, worst_fields)
            beside = await _others(h.sidecar.address, seconds, worst)
        finally:
            await dear.close()
    finally:
        await client.close()
        await probe.close()
    extra_ms = (per_call["worst"].p50 - per_call["static"].p50) / 1e6
    value = ratio(beside.p99, calm.p99)
    details = {
        "rule": {"match": rule.match, "mutations": len(rule.mutations)},
        "estimate_units": estimate,
        "limit_units": limit,
        "rule_ms_per_assembly_p50": round(extra_ms, 2),
        "worst_assemble": per_call["worst"].summary_us(),
        "static_assemble_same_scope": per_call["static"].summary_us(),
        "others_calm": calm.summary_us(),
        "others_beside": beside.summary_us(),
        "others": "4 callers, each on its own connection, assembling the realistic load with"
        " changing fields in a loop; the dear caller on its own connection",
        "seconds_each": seconds,
    }
    shown = (
        f"{value:.2f}x p99 ({beside.p99 / 1e6:.2f} ms / {calm.p99 / 1e6:.2f} ms calm); the rule"
        f" {extra_ms:.2f} ms an assembly"
    )
    name = "dearest admitted rule: other callers' p99 beside it / calm"
    judged = at_most(value, TARGETS["rule_worst"], "≤ {:g}x calm")
    return [figure("rule_worst", name, value, "x", judged, details, display=shown)]


async def _others(address: str, seconds: float, worst: Operation | None) -> Samples:
    """Four callers, each on a connection of its own, assembling for `seconds` (with `worst`
    looping beside them): their times."""
    count = itertools.count()
    probes = [Probe.open(address, OWN_CONNECTION) for _ in range(4)]
    times: list[int] = []
    deadline = time.perf_counter() + seconds

    async def caller(probe: Probe) -> None:
        operation = assemble_with(probe, "", lambda: _fields(count))
        await operation()  # connected before timing
        while time.perf_counter() < deadline:
            start = time.perf_counter_ns()
            await operation()
            times.append(time.perf_counter_ns() - start)

    async def dear() -> None:
        assert worst is not None
        while time.perf_counter() < deadline:
            await worst()

    tasks = [caller(probe) for probe in probes] + ([dear()] if worst is not None else [])
    try:
        await asyncio.gather(*tasks)
    finally:
        for probe in probes:
            await probe.close()
    return Samples.of(times)


async def rules_memory(h: Harness) -> list[Figure]:
    """A fresh sidecar's RSS before and after 100 rules (the typical ten's shapes, each
    with a name and literals of its own), after one rule has loaded the CEL library."""
    sidecar = await procs.start_sidecar(label="sidecar-rules")
    try:
        clients = [
            await dsp.connect(sidecar.address, client_name=f"bench-rules-{i}") for i in range(3)
        ]
        shapes = list(ten_rules().values())
        await clients[2].rule("warm", shapes[0])  # the library and its environment loaded
        await asyncio.sleep(0.2)
        before = sidecar.rss_kib()
        for i in range(100):
            rule = shapes[i % len(shapes)]
            literal = Rule(
                [*rule.mutations, Mutation.drop_tools(f"tool.name == 'never-{i}'")],
                match=[*rule.match, f"scope != 'not-{i}'"],
                variables=rule.variables,
            )
            await clients[i % 2].rule(f"rule-{i:03d}", literal)
        await asyncio.sleep(0.2)
        after = sidecar.rss_kib()
        for client in clients:
            await client.close()
    finally:
        await sidecar.stop()
    per_100_mib = (after - before) / 1024
    details = {"rss_before_kib": before, "rss_after_kib": after, "rules": 100}
    name = "sidecar RSS per 100 registered rules"
    return [figure("rules_memory", name, per_100_mib, "MiB", "reported", details)]
