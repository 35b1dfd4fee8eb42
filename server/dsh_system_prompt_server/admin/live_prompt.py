"""A scope's prompt from its static parts now; dynamic parts stand in as placeholders.

Nothing here evaluates a provider or runs a listener: the page looks, it never
calls a client. Issue 16's live prompts (`prompt_watch.static_view`) build the
same view for the wire; once they are on main this module gives way to them,
and the page keeps calling `static_assembly`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsh_system_prompt_core import TOOL_ORDER_REST

from ..registry import AssembleContext, Assembly, Dynamic, Entry, Kind, Registry, Tool, ToolSet
from ..registry.assembly import Plan

PLACEHOLDER_TOOL_DESCRIPTION = "provided at each assembly; the admin page does not evaluate it"


@dataclass(frozen=True)
class StaticPrompt:
    """A scope's assembly of static parts (tracked: origins filled) at one revision."""

    assembly: Assembly
    revision: int
    placeholders: frozenset[tuple[str, str]]  # (section|context|tool, name) of dynamic parts


async def static_assembly(registry: Registry, scope: str | None) -> StaticPrompt:
    """The scope's prompt of static parts now, dynamic ones as placeholders.

    Raises RegistryError when the static parts cannot assemble (two complete sections).
    """
    plan = registry.plan(scope)
    static = static_plan(plan, registry.settings.tool_order)
    assembly = await registry.run(static, AssembleContext(scope), track=True)
    return StaticPrompt(assembly, plan.revision, frozenset(_placeholders(plan)))


def _placeholders(plan: Plan) -> list[tuple[str, str]]:
    """(kind, name) of every part a placeholder stands for (a tool's is its label)."""
    named = {Kind.SECTION: "section", Kind.CONTEXT: "context"}
    keys = []
    for entry, _ in plan.dynamic:
        if entry.kind in named:
            keys.append((named[entry.kind], entry.name))
        elif entry.kind is Kind.TOOLS:
            keys.append(("tool", placeholder_label(entry)))
    return keys


def static_plan(plan: Plan, tool_order: Sequence[str] | None) -> Plan:
    """`plan` with every dynamic value replaced by a placeholder, and no listeners."""
    return Plan(
        revision=plan.revision,
        chain=plan.chain,
        suppressed=plan.suppressed,
        variables=[_placeheld(entry, tool_order) for entry in plan.variables],
        sections=[_placeheld(entry, tool_order) for entry in plan.sections],
        contexts=[_placeheld(entry, tool_order) for entry in plan.contexts],
        tools=[_placeheld(entry, tool_order) for entry in plan.tools],
        listeners=[],
    )


def placeholder_label(entry: Entry[Any]) -> str:
    """What stands for a dynamic value: `<dynamic section "cwd">`."""
    name = f' "{entry.name}"' if entry.name else ""
    return f"<dynamic {entry.kind.value}{name}>"


def _placeheld(entry: Any, tool_order: Sequence[str] | None) -> Any:
    if not isinstance(entry.value, Dynamic):
        return entry
    label = placeholder_label(entry)
    if entry.kind is not Kind.TOOLS:
        return dataclasses.replace(entry, value=label)
    # It may provide any tool the order names, so the order is not refused for it.
    known = tuple(name for name in tool_order or () if name != TOOL_ORDER_REST)
    tools = ToolSet((Tool(label, PLACEHOLDER_TOOL_DESCRIPTION, "{}"),), (label, *known))
    return dataclasses.replace(entry, value=tools)
