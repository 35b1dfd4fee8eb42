"""Small helpers the tests share (imported as `helpers`)."""

from __future__ import annotations

import dsh_system_prompt as dsp

IDENTITY = "You are an AI agent powered by DeepSeek Harness."


def section_names(assembly: dsp.PromptAssembly) -> list[str]:
    return [section.name for section in assembly.sections]


def context_names(assembly: dsp.PromptAssembly) -> list[str]:
    return [context.name for context in assembly.contexts]


def tool_names(assembly: dsp.PromptAssembly) -> list[str]:
    return [tool.name for tool in assembly.tools]


def tool(name: str, description: str = "") -> dsp.ToolSchema:
    return dsp.ToolSchema(name, description or f"the {name} tool", {"type": "object"})
