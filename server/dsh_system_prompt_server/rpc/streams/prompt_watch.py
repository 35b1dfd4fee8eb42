"""Live prompts: a scope's prompt from its static parts, and the cache verdict per change.

A watcher never evaluates a dynamic part: each is replaced by a placeholder
(`<dynamic section "cwd">`), and listeners are not run. Each prompt is reported
against the previous one of the same stream with the prompt-cache report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import (
    TOOL_ORDER_REST,
    RenderFailure,
    render_context_snapshot,
    render_prompt,
)

from ...registry import (
    AssembleContext,
    ChangeEvent,
    Dynamic,
    Kind,
    Missed,
    Registration,
    Registry,
    RegistryError,
    Tool,
    ToolSet,
)
from ...registry.assembly import Plan
from ...reports.history import HistoryKey
from ...reports.report import build_report
from ...reports.tokens import Tokenizer
from ...reports.values import Layout, Previous
from ..convert import assembly_to_proto, change_to_proto, report_to_proto

MAX_CHANGES_LISTED = 64  # per message; the rest of a burst is counted, not listed
PLACEHOLDER_TOOL_DESCRIPTION = "provided at each assembly; a watcher does not evaluate it"


class PromptWatch:
    """One WatchPrompt stream's prompts, each compared with the one before."""

    def __init__(
        self,
        registry: Registry,
        scope: str | None,
        render: bool,
        layout: Layout,
        tokenizer: Tokenizer | None,
        incarnation: str,
    ) -> None:
        self._registry = registry
        self._scope = scope
        self._render = render
        self._layout = layout
        self._tokenizer = tokenizer
        self._incarnation = incarnation
        self._key = HistoryKey("scope", scope)
        self._previous: Previous | None = None

    async def prompt(self, changes: Sequence[ChangeEvent | Missed] = ()) -> pb.WatchPromptResponse:
        """The scope's prompt now, with `changes` (what led to it since the last one)."""
        plan = static_view(self._registry.plan(self._scope), self._registry.settings.tool_order)
        events = [change for change in changes if isinstance(change, ChangeEvent)]
        missed = sum(change.count for change in changes if isinstance(change, Missed))
        listed = events[-MAX_CHANGES_LISTED:]
        response = pb.WatchPromptResponse(
            revision=plan.revision,
            incarnation=self._incarnation,
            changes=[change_to_proto(event).event for event in listed],
            changes_omitted=missed + len(events) - len(listed),
        )
        try:
            assembly = await self._registry.run(plan, AssembleContext(self._scope), track=True)
        except RegistryError as error:
            response.error = error.message
            return response
        report, self._previous = build_report(
            assembly, self._tokenizer, self._layout, self._previous
        )
        response.assembly.CopyFrom(assembly_to_proto(assembly))
        response.report.CopyFrom(report_to_proto(report, self._key))
        if self._render:
            try:
                prompt, snapshot = render_prompt(assembly), render_context_snapshot(assembly)
            except RenderFailure:
                pass  # report.render_error says why
            else:
                response.rendered.CopyFrom(
                    pb.RenderedPrompt(prompt=prompt, context_snapshot=snapshot)
                )
        return response


def static_view(plan: Plan, tool_order: Sequence[str] | None) -> Plan:
    """`plan` with every dynamic value replaced by a placeholder and no listeners."""
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


def _placeheld(entry: Any, tool_order: Sequence[str] | None) -> Any:
    if not isinstance(entry.value, Dynamic):
        return entry
    return dataclasses.replace(entry, value=placeholder(entry, tool_order))


def placeholder(entry: Registration[Any], tool_order: Sequence[str] | None) -> str | ToolSet:
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
    return ToolSet((Tool(label, PLACEHOLDER_TOOL_DESCRIPTION, "{}"),), (label, *known))
