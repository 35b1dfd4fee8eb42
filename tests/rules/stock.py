"""What the rules tests share: a catalogue of tools, a client with a few parts, and two
operator rules as a config file spells them."""

from __future__ import annotations

import dsh_system_prompt as dsp
from helpers import tool

NO_WEB = """
[[rules]]
name = "no-web"
mutations = [{ drop_tools = "tool.name.startsWith('web_')" }]
"""
GITHUB_FIRST = """
[[rules]]
name = "github-first"
scope = "team-*"
prepend = true
match = ["'agent' in fields"]
variables = { agent = "fields.agent" }
[[rules.mutations]]
tool_order = { names = ["mcp__github__pr", "mcp__github__issue"] }
[[rules.mutations]]
upsert_sections = { parts = [{ name = "who", order = 50, text = "'Agent ' + variables.agent" }] }
"""
TOOLS = ["bash", "mcp__github__issue", "mcp__github__pr", "todo_write", "web_fetch"]


async def stocked(client: dsp.Client) -> None:
    """Five tools, sections at orders 10 and 30, a context, a variable."""
    await client.tools([tool(name, f"{name} does things") for name in TOOLS])
    await client.section("intro", 10, "Hello.")
    await client.section("outro", 30, "Bye.")
    await client.context("clock", 10, "noon")
    await client.variable("model", "v3")
