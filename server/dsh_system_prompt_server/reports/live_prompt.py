"""A live prompt: a scope's prompt from its static parts, each reported against the one before.

Nothing here knows a transport: WatchPrompt (`rpc/streams/prompt_watch.py`) encodes each
prompt for its stream, the admin page (`admin/live_prompt.py`) for its view. A live prompt
never evaluates a dynamic part: each is replaced by a placeholder (`<dynamic section
"cwd">`), and listeners are not run; rules are (the sidecar runs them itself, asking no
client), with no fields, as an Assemble without fields would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsh_system_prompt_core import TOOL_ORDER_REST

from ..registry import (
    AnyRegistration,
    AssembleContext,
    Assembly,
    Dynamic,
    Kind,
    PartKey,
    PartKind,
    Plan,
    Registry,
    RuleRegistration,
    Tool,
    ToolSet,
)
from .report import build_report
from .tokens import Tokenizer
from .values import Layout, Previous, Report

PLACEHOLDER_TOOL_DESCRIPTION = "provided at each assembly; a watcher does not evaluate it"


@dataclass(frozen=True)
class StaticPrompt:
    """A scope's prompt of static parts at one revision, reported against the one before."""

    revision: int
    assembly: Assembly  # tracked: origins filled
    report: Report
    laid_out: Previous  # this prompt as the next one is compared with it
    before: Previous | None  # the prompt it was compared with; None for the first
    placeholders: frozenset[PartKey]  # the dynamic parts (sections, contexts, tools)


class LivePrompt:
    """One scope's static prompt as it changes, each reported against the one before."""

    def __init__(self, registry: Registry, scope: str | None, tokenizer: Tokenizer | None) -> None:
        self._registry = registry
        self._scope = scope
        self._tokenizer = tokenizer
        self._previous: Previous | None = None

    async def next(self, layout: Layout) -> StaticPrompt:
        """The scope's prompt now, laid out in `layout`, reported against the last one.

        Raises RegistryError when the static parts cannot assemble (two complete
        sections); the next prompt is then compared with the last one that did.
        """
        plan = self._registry.plan(self._scope)
        tool_order = self._registry.settings.tool_order
        assembly = await self._registry.run(
            static_view(plan, tool_order), AssembleContext(scope=self._scope), track=True
        )
        report, current = build_report(assembly, self._tokenizer, layout, self._previous)
        before, self._previous = self._previous, current
        return StaticPrompt(
            revision=plan.revision,
            assembly=assembly,
            report=report,
            laid_out=current,
            before=before,
            placeholders=frozenset(_placeholders(plan, tool_order)),
        )


def static_view(plan: Plan, tool_order: Sequence[str] | None) -> Plan:
    """`plan` with every dynamic value replaced by a placeholder, and of its waterfall only
    the rules, in their places (a listener is a client's, and a watcher asks no client)."""
    return Plan(
        revision=plan.revision,
        chain=plan.chain,
        suppressed=plan.suppressed,
        variables=[_placeheld(entry, tool_order) for entry in plan.variables],
        sections=[_placeheld(entry, tool_order) for entry in plan.sections],
        contexts=[_placeheld(entry, tool_order) for entry in plan.contexts],
        tools=[_placeheld(entry, tool_order) for entry in plan.tools],
        listeners=[step for step in plan.listeners if isinstance(step, RuleRegistration)],
    )


def _placeheld(entry: Any, tool_order: Sequence[str] | None) -> Any:
    if not isinstance(entry.value, Dynamic):
        return entry
    return dataclasses.replace(entry, value=placeholder(entry, tool_order))


def placeholder(entry: AnyRegistration, tool_order: Sequence[str] | None) -> str | ToolSet:
    """What stands for a dynamic value: a text naming it, or one tool naming the provider."""
    label = (
        f'<dynamic {entry.kind.value} "{entry.name}">'
        if entry.name
        else (f"<dynamic {entry.kind.value}>")
    )
    if entry.kind is not Kind.TOOLS:
        return label
    # It may know any name the tool order lists: the order is not refused for it.
    known = tuple(name for name in tool_order or () if name != TOOL_ORDER_REST)
    tool = Tool(name=label, description=PLACEHOLDER_TOOL_DESCRIPTION, parameters_json="{}")
    return ToolSet(schemas=(tool,), known_names=(label, *known))


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
