"""The realistic load: 30 sections, 10 runtime contexts, 40 tools with ~1 KB JSON
schemas and 10 variables, loaded into a Registry directly or through a client.

The text is generated deterministically. A third of the sections and half of
the contexts reference variables, so rendering does real interpolation work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_server import Registry
from dsh_system_prompt_server.registry import Tool, ToolSet

SECTIONS = 30
CONTEXTS = 10
TOOLS = 40
TOOLS_PER_PROVIDER = 5  # 8 plugins contribute 5 tools each
VARIABLES = 10
SCHEMA_BYTES = 1024

VARIABLE_VALUES = {
    "model": "deepseek-v4",
    "cwd": "/home/agent/work/project",
    "user": "benchmark-user",
    "os": "Linux 6.8 x86_64",
    "shell": "/bin/bash",
    "date": "2025-01-31",
    "project": "dsh-system-prompt",
    "language": "English",
    "max_output_tokens": "8192",
    "timezone": "Europe/Paris",
}

_FILLER = (
    "Read the relevant files before changing them, keep changes small and focused, "
    "explain what you did and why, and never invent facts about the code base. "
)


@dataclass(frozen=True)
class NamedText:
    name: str
    order: float
    text: str


@dataclass(frozen=True)
class Workload:
    sections: tuple[NamedText, ...]
    contexts: tuple[NamedText, ...]
    tool_groups: tuple[tuple[dsp.ToolSchema, ...], ...]
    variables: dict[str, str]

    @property
    def tool_count(self) -> int:
        return sum(len(group) for group in self.tool_groups)

    def describe(self) -> dict[str, Any]:
        """What the load holds, for the JSON details."""
        schema_sizes = [
            len(_schema_json(tool.parameters)) for group in self.tool_groups for tool in group
        ]
        return {
            "sections": len(self.sections),
            "contexts": len(self.contexts),
            "tools": self.tool_count,
            "tool_providers": len(self.tool_groups),
            "variables": len(self.variables),
            "mean_schema_bytes": round(sum(schema_sizes) / len(schema_sizes)),
            "section_bytes": sum(len(s.text) for s in self.sections),
        }


def build() -> Workload:
    """The load every figure that says "realistic load" uses."""
    names = list(VARIABLE_VALUES)
    sections = []
    for i in range(SECTIONS):
        body = _FILLER * (2 + i % 4)
        if i % 3 == 0:
            first, second = names[i % VARIABLES], names[(i + 3) % VARIABLES]
            body = f"Facts: {first} is {{{{{first}}}}}; {second} is {{{{{second}}}}}. {body}"
        sections.append(NamedText(f"plugin-{i:02d}:rules", 10 + i * 10, body.strip()))
    contexts = []
    for i in range(CONTEXTS):
        text = f"Context {i}: the last command exited 0 after {i * 7} ms."
        if i % 2 == 0:
            text += f" Working in {{{{cwd}}}} as {{{{user}}}} ({names[i % VARIABLES]})."
        contexts.append(NamedText(f"runtime-{i:02d}", i, text))
    tools = [_tool(i) for i in range(TOOLS)]
    groups = tuple(
        tuple(tools[i : i + TOOLS_PER_PROVIDER]) for i in range(0, TOOLS, TOOLS_PER_PROVIDER)
    )
    return Workload(tuple(sections), tuple(contexts), groups, dict(VARIABLE_VALUES))


def _tool(index: int) -> dsp.ToolSchema:
    """A tool whose JSON schema is about SCHEMA_BYTES long."""
    properties: dict[str, Any] = {}
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": []}
    field = 0
    while len(_schema_json(parameters)) < SCHEMA_BYTES - 120:
        name = f"arg_{field}"
        properties[name] = {
            "type": ["string", "integer", "boolean"][field % 3],
            "description": f"Argument {field} of tool {index}: what it selects and its unit.",
        }
        if field % 2 == 0:
            parameters["required"].append(name)
        field += 1
    parameters["additionalProperties"] = False
    description = f"Tool number {index}: does one thing well."
    return dsp.ToolSchema(f"tool_{index:02d}", description, parameters)


def _schema_json(parameters: dict[str, Any]) -> str:
    return json.dumps(parameters, separators=(",", ":"))


def load_registry(registry: Registry, workload: Workload, owner: str = "bench") -> None:
    """Register the load in the global layer of an in-process registry."""
    for name, value in workload.variables.items():
        registry.register_variable(owner, None, name, value)
    for section in workload.sections:
        registry.register_section(owner, None, section.name, section.order, section.text)
    for context in workload.contexts:
        registry.register_context(owner, None, context.name, context.order, context.text)
    for group in workload.tool_groups:
        tools = tuple(Tool(t.name, t.description, _schema_json(t.parameters)) for t in group)
        registry.register_tools(owner, None, ToolSet(tools))


async def load_client(client: dsp.Client, workload: Workload) -> None:
    """Register the load in the global layer through a client session."""
    for name, value in workload.variables.items():
        await client.variable(name, value)
    for section in workload.sections:
        await client.section(section.name, section.order, section.text)
    for context in workload.contexts:
        await client.context(context.name, context.order, context.text)
    for group in workload.tool_groups:
        await client.tools(list(group))
