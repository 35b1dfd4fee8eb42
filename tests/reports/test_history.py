"""Prompt-cache history per key: how often the prefix broke, who broke it, what it cost."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import ClientOf, SidecarFactory, rejection, report_of
from processes import cli_output, free_port
from scripted import Script, ScriptedSidecar

DEEPSEEK = {"prompt_tokens": 1200, "prompt_cache_hit_tokens": 1024, "prompt_cache_miss_tokens": 176}
ANTHROPIC = {"input_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 5}
OPENAI = {"prompt_tokens": 1500, "prompt_tokens_details": {"cached_tokens": 1280}}
IGNORE = dsp.FailurePolicy.IGNORE
grpc_max_workers = 4  # pytest-grpc: each open stream of the scripted sidecar holds a thread


def probe(context: dsp.AssembleContext) -> str:
    if context.get("down"):
        raise RuntimeError("the probe is down")
    return "The probe is up."


async def weather(assembly: dsp.PromptAssembly, context: Any, next_: dsp.Next) -> Any:
    if context.get("down"):
        raise RuntimeError("no weather today")
    return await next_(assembly)


async def skipping_history(client: dsp.Client, key: str) -> dsp.AssemblyReport:
    """A complete report of `key`, then one whose five IGNORE sections and one listener
    fail (more steps than the history keeps of the steps themselves); the latter."""
    for index in range(5):
        await client.section(f"probe-{index}", 20 + index, probe, failure_policy=IGNORE)
    await client.on_assemble(weather, name="weather", failure_policy=IGNORE)
    await report_of(client, key=key)
    return await report_of(client, key=key, down=True)


async def test_two_agents_sharing_a_scope_see_false_breaks_unless_each_names_its_key(
    client: dsp.Client,
) -> None:
    await client.section("who", 20, lambda ctx: f"You are {ctx.get('agent')}.")
    for _ in range(2):
        await report_of(client, agent="planner")
        shared = await report_of(client, agent="coder")
    assert shared.stability.reason == 'section "who" text changed'
    for _ in range(2):
        await report_of(client, key="planner", agent="planner")
        own = await report_of(client, key="coder", agent="coder")
    assert own.history_key == 'key "coder"' and own.stability.reason == ""
    assert (await client.cache_history(report_key="coder")).breaks == 0


async def test_the_history_counts_breaks_and_names_the_part_that_broke_it(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("clock", 30, lambda ctx: f"Now: {ctx.get('now')}.")
    reports = [await report_of(client, "agent-1", now=now) for now in ("10:00", "10:01", "10:02")]
    history = await client.cache_history("agent-1")
    assert history.key == 'scope "agent-1"'
    assert (history.reports, history.breaks) == (3, 2)
    assert history.breakers == [('section "clock"', 2)]
    assert history.recomputed.bytes == sum(r.stability.recomputed.bytes for r in reports) > 0
    assert [e.first_changed for e in history.recent] == ["", 'section "clock"', 'section "clock"']
    assert not history.recent[0].has_previous


async def test_the_history_keeps_only_the_configured_recent_reports(
    client_of: ClientOf,
) -> None:
    async with client_of(report_history=2) as client:
        for _ in range(3):
            await report_of(client)
        history = await client.cache_history()
    assert history.reports == 3 and [e.sequence for e in history.recent] == [2, 3]


async def test_an_evicted_key_is_never_called_new(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar(report_keys=2)
    async with dsp.connect(sidecar.address) as client:
        for scope in ("a", "b", "c"):  # "a" is evicted to make room for "c"
            await report_of(client, scope)
        assert (await client.cache_history("a")).evicted
        again = await report_of(client, "a")
        assert not again.stability.has_previous and again.stability.previous_evicted
        # "a" evicted "b": the CLI must not call b's next report a first one
        output = await cli_output(
            "assemble", "--address", sidecar.address, "--report", "--scope", "b"
        )
    assert "first report" not in output
    assert 'the earlier reports of scope "b" were evicted' in output


async def test_usage_from_each_model_server_is_shown_against_the_prediction(
    client_of: ClientOf,
) -> None:
    async with client_of(tokenizer="deepseek-v4") as client:
        await client.section("rules", 10, "Be precise.")
        await report_of(client, key="conv")
        second = await report_of(client, key="conv")
        observed = {}
        for name, usage in (("deepseek", DEEPSEEK), ("anthropic", ANTHROPIC), ("openai", OPENAI)):
            entry = await client.report_usage(usage, report_key="conv")
            observed[name] = (entry.observed_cached_tokens, entry.observed_prompt_tokens)
        history = await client.cache_history(report_key="conv")
    assert observed == {"deepseek": (1024, 1200), "anthropic": (1000, 1025), "openai": (1280, 1500)}
    latest = history.recent[-1]
    assert latest.stable_tokens == second.stability.stable_tokens == second.stability.prefix.tokens
    assert latest.observed_cached_tokens == 1280


async def test_usage_for_a_key_never_reported_is_not_found(client: dsp.Client) -> None:
    error = await rejection(client.report_usage(DEEPSEEK, "nobody"))
    assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, dsp.Reason.REPORT_NOT_FOUND)
    assert 'no reported assembly for scope "nobody"' in error.message


async def test_usage_without_a_cached_token_figure_is_refused_in_the_client(
    client: dsp.Client,
) -> None:
    error = await rejection(client.report_usage({"total_tokens": 9}))
    assert error.reason == dsp.Reason.INVALID_VALUE


async def test_an_oversized_report_key_is_refused(client: dsp.Client) -> None:
    error = await rejection(client.assemble(report=True, report_key="k" * 300))
    assert (error.code, error.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        dsp.Reason.VALUE_TOO_LARGE,
    )


async def test_metrics_count_reports_breaks_recomputed_tokens_and_the_observed_ratio(
    client_of: ClientOf,
) -> None:
    address = f"127.0.0.1:{free_port()}"
    async with client_of(
        metrics_listen=address, tokenizer="deepseek-v4", metrics_key_labels=True
    ) as client:
        await client.section("clock", 30, lambda ctx: f"Now: {ctx.get('now')}.")
        await report_of(client, "agent-1", now="10:00")
        broken = await report_of(client, "agent-1", now="10:01")
        await client.report_usage({"prompt_cache_hit_tokens": 6}, "agent-1")

    def get() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
            return str(response.read().decode())

    text = await asyncio.to_thread(get)
    labels = 'key="agent-1",key_kind="scope"'
    assert f"dsp_cache_reports_total{{{labels}}} 2.0" in text
    assert f'dsp_cache_breaks_total{{{labels},part="section \\"clock\\""}} 1.0' in text
    recomputed = broken.stability.recomputed.tokens
    assert f'dsp_cache_recomputed_total{{{labels},unit="tokens"}} {float(recomputed or 0)}' in text
    ratio = 6 / (broken.stability.stable_tokens or 1)
    assert f"dsp_cache_observed_ratio{{{labels}}} {ratio}" in text


async def test_cli_cache_history_prints_a_table_and_json(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("clock", 30, lambda ctx: f"Now: {ctx.get('now')}.")
    for now in ("10:00", "10:01"):
        await report_of(client, key="conv-7", now=now)
    table = await cli_output("cache-history", "--address", sidecar.address, "--key", "conv-7")
    assert 'key "conv-7": 2 reported, 1 broke the prefix;' in table
    assert 'section "clock": 1 break' in table
    shown = json.loads(
        await cli_output("cache-history", "--address", sidecar.address, "--key", "conv-7", "--json")
    )
    assert (shown["reports"], shown["breaks"]) == (2, 1)
    assert shown["breakers"] == [['section "clock"', 1]]


async def test_cli_assemble_report_json_includes_the_report(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("rules", 10, "Be precise.")
    shown = json.loads(
        await cli_output("assemble", "--address", sidecar.address, "--report", "--json")
    )
    assert shown["sections"][-1] == {"name": "rules", "text": "Be precise."}
    assert shown["report"]["history_key"] == "the global scope"
    assert [p["name"] for p in shown["report"]["parts"]] == ["harness:identity", "rules"]


@pytest.mark.parametrize("flag", [["--scope", "s"], ["--key", "k"]])
async def test_cli_cache_history_of_an_unknown_key_says_there_is_none(
    sidecar: Sidecar, flag: list[str]
) -> None:
    output = await cli_output("cache-history", "--address", sidecar.address, *flag)
    assert "no reported assemblies" in output


async def test_a_timestamp_section_is_named_every_turn_until_moved_to_a_context(
    make_sidecar: SidecarFactory,
) -> None:
    """The walk-through of docs/prompt-cache.md: two agents share scope "team"."""
    sidecar = await make_sidecar(tokenizer="deepseek-v4")
    ticks = iter(range(1000))
    async with dsp.connect(sidecar.address) as first, dsp.connect(sidecar.address) as second:
        team = await first.scope("team")
        await team.section("rules", 10, "Be precise.")
        clock = await team.section("clock", 30, lambda ctx: f"Now: 10:{next(ticks):02d}.")
        for _turn in range(3):
            for agent, client in (("planner", first), ("coder", second)):
                await report_of(client, "team", key=f"{agent}-conv", agent=agent)
        broken = await first.cache_history(report_key="planner-conv")
        await clock()
        await team.context("clock", 1, lambda ctx: f"Now: 10:{next(ticks):02d}.")
        for _turn in range(3):
            await report_of(first, "team", key="planner-after")
        fixed = await first.cache_history(report_key="planner-after")
    assert (broken.reports, broken.breaks) == (3, 2)
    assert broken.breakers == [('section "clock"', 2)]
    assert all(e.reason == 'section "clock" text changed' for e in broken.recent[1:])
    assert broken.recomputed.tokens == sum(e.recomputed.tokens or 0 for e in broken.recent) > 0
    assert (fixed.reports, fixed.breaks, fixed.breakers) == (3, 0, [])


async def test_each_history_entry_counts_the_steps_its_assembly_skipped_by_kind_and_reason(
    client: dsp.Client,
) -> None:
    skipping = await skipping_history(client, "conv")
    history = await client.cache_history(report_key="conv")
    counts = (
        dsp.SkippedCount("section", dsp.Reason.PROVIDER_FAILED, 5),
        dsp.SkippedCount("listener", dsp.Reason.LISTENER_FAILED, 1),
    )
    assert [entry.skipped_counts for entry in history.recent] == [(), counts]
    assert sum(counted.count for counted in counts) == len(skipping.skipped) == 6
    assert history.recent[-1].first_changed == 'section "probe-0"'  # the skips broke it
    entry = await client.report_usage(DEEPSEEK, report_key="conv")  # the same entry, observed
    assert entry.skipped_counts == counts


async def test_cli_cache_history_shows_the_steps_each_report_skipped(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await skipping_history(client, "conv-8")
    table = await cli_output("cache-history", "--address", sidecar.address, "--key", "conv-8")
    (row,) = [line for line in table.splitlines() if line.startswith("│ 2 ")]
    assert "5 section PROVIDER_FAILED, 1 listener LISTENER_FAILED" in row
    shown = json.loads(
        await cli_output("cache-history", "--address", sidecar.address, "--key", "conv-8", "--json")
    )
    assert [entry["skipped_counts"] for entry in shown["recent"]] == [
        [],
        [
            {"kind": "section", "reason": "PROVIDER_FAILED", "count": 5},
            {"kind": "listener", "reason": "LISTENER_FAILED", "count": 1},
        ],
    ]


async def test_a_reason_names_four_skipped_steps_and_counts_the_rest_however_many_failed(
    client: dsp.Client,
) -> None:
    for index in range(50):  # names of 250 bytes: naming them all, the reason would be 14 KB
        await client.section(
            f"probe-{index:02}-{'x' * 241}", 20 + index, probe, failure_policy=IGNORE
        )
    await report_of(client, key="many")
    broken = await report_of(client, key="many", down=True)
    assert len(broken.skipped) == 50  # the report still lists every step
    named = ", ".join(f'section "{step.name}" ({step.reason})' for step in broken.skipped[:4])
    assert broken.stability.reason == (
        f'section "{broken.skipped[0].name}" removed; this assembly skipped {named} and 46 more'
    )
    assert len(broken.stability.reason.encode()) < 6 * 256  # a few names of max_name_bytes
    history = await client.cache_history(report_key="many")
    assert history.recent[-1].reason == broken.stability.reason


def rewriter(name: str) -> Any:
    """A listener that rewrites section "turn" when the context names it, so the reason
    of every report names it: `listener "NAME" changed section "turn"`."""

    async def rewrite(assembly: dsp.PromptAssembly, context: Any, next_: dsp.Next) -> Any:
        if context.get("who") == name:
            turn = dsp.AssembledSection("turn", f"Turn {context.get('n')}.")
            assembly.sections = [turn if s.name == "turn" else s for s in assembly.sections]
        return await next_(assembly)

    return rewrite


SHORT, LONG = "a", "w" * 250


async def rewritten_history(client: dsp.Client, key: str, who: str) -> list[str]:
    """Nine reports of `key` whose section `who` rewrites: the reasons of the 8 kept."""
    for turn in range(9):
        await report_of(client, key=key, who=who, n=turn)
    return [entry.reason for entry in (await client.cache_history(report_key=key)).recent]


async def rewriting_client(sidecar: Sidecar) -> dsp.Client:
    client = await dsp.connect(sidecar.address)
    await client.section("turn", 10, "Turn 0.")
    for name in (SHORT, LONG):
        await client.on_assemble(rewriter(name), name=name)
    return client


async def test_the_history_counts_its_reasons_real_size_and_evicts_at_the_byte_bound(
    make_sidecar: SidecarFactory,
) -> None:
    # Two keys alike but for the listener their reasons name: 1 character or 250.
    measured = await make_sidecar()
    client = await rewriting_client(measured)
    try:
        short = await rewritten_history(client, "key-s", SHORT)
        short_bytes = measured.state.reports.bytes
        long_ = await rewritten_history(client, "key-l", LONG)
        long_bytes = measured.state.reports.bytes - short_bytes
    finally:
        await client.close()
    assert short[-1] == 'listener "a" changed section "turn"' and LONG in long_[-1]
    extra = sum(map(sys.getsizeof, long_)) - sum(map(sys.getsizeof, short))
    # each kept reason, and the listener's name it keeps to name it per reader, as held
    assert extra <= long_bytes - short_bytes <= 3 * extra
    # Room for three short keys and one key's longer reasons: the third long key evicts.
    bound = 3 * short_bytes + extra
    bounded = await make_sidecar(limits={"max_report_history_bytes": bound})
    client = await rewriting_client(bounded)
    try:
        for key in ("key-0", "key-1", "key-2"):
            await rewritten_history(client, key, LONG)
        kept = [
            not (await client.cache_history(report_key=k)).evicted
            for k in ("key-0", "key-1", "key-2")
        ]
    finally:
        await client.close()
    assert kept == [False, True, True]
    assert bounded.state.reports.bytes == 2 * long_bytes <= bound  # the two kept, no more


class ForgedSkips(Script):
    """A sidecar whose history counts a skip under a reason with control characters."""

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        if method != "GetCacheHistory":
            return super().answer(method, request, context)
        forged = pb.SkippedCount(kind=pb.CHANGE_KIND_SECTION, reason="FORGED\n\x1b[31mred", count=2)
        entry = pb.CacheHistoryEntry(sequence=1, revision=1, skipped_counts=[forged])
        history = pb.CacheHistory(key='key "k"', reports=1, recent=[entry], recomputed=pb.Size())
        return pb.GetCacheHistoryResponse(history=history)


async def test_cli_cache_history_prints_a_skipped_reasons_control_characters_as_escapes(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = ForgedSkips()
    table = await cli_output("cache-history", "--address", scripted.address, "--key", "k")
    assert "\x1b" not in table
    (row,) = [line for line in table.splitlines() if line.startswith("│ 1 ")]
    assert "2 section FORGED\\n\\x1b[31mred" in row
