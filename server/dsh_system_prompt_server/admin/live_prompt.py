"""A scope's prompt from its static parts now; dynamic parts stand in as placeholders.

The page looks, it never calls a client: this is the live prompt of issue 16's
WatchPrompt (`prompt_watch.static_view`), assembled in process for the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..registry import AssembleContext, Assembly, Kind, PartKey, PartKind, Registry, ToolSet
from ..registry.assembly import Plan
from ..rpc.streams.prompt_watch import placeholder, static_view


@dataclass(frozen=True)
class StaticPrompt:
    """A scope's assembly of static parts (tracked: origins filled) at one revision."""

    assembly: Assembly
    revision: int
    placeholders: frozenset[PartKey]  # the dynamic parts (sections, contexts, tools)


async def static_assembly(registry: Registry, scope: str | None) -> StaticPrompt:
    """The scope's prompt of static parts now, dynamic ones as placeholders.

    Raises RegistryError when the static parts cannot assemble (two complete sections).
    """
    plan = registry.plan(scope)
    tool_order = registry.settings.tool_order
    assembly = await registry.run(static_view(plan, tool_order), AssembleContext(scope), track=True)
    return StaticPrompt(assembly, plan.revision, frozenset(_placeholders(plan, tool_order)))


def _placeholders(plan: Plan, tool_order: Sequence[str] | None) -> list[PartKey]:
    """(kind, name) of every part a placeholder stands for (a tool's name is its label)."""
    named = {Kind.SECTION: PartKind.SECTION, Kind.CONTEXT: PartKind.CONTEXT}
    keys = []
    for entry, _ in plan.dynamic:
        if entry.kind in named:
            keys.append((named[entry.kind], entry.name))
        elif isinstance(tools := placeholder(entry, tool_order), ToolSet):
            keys.extend((PartKind.TOOL, tool.name) for tool in tools.schemas)
    return keys
