"""The assembly the waterfall starts from: a plan's parts with this assembly's values, the
static ones made once a plan (`Plan.made`), and the tools collected, checked and ordered."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dsh_system_prompt_core import TOOL_ORDER_REST

from .. import errors
from ..model import (
    Assembly,
    ContextRegistration,
    Dynamic,
    Part,
    ProvidedValue,
    SectionRegistration,
    Tool,
    ToolSet,
    ToolsRegistration,
    ValueRegistration,
    VariableRegistration,
)
from .plan import Plan
from .tool_order import check_known, order_tools


def prelude(
    plan: Plan,
    values: Mapping[ValueRegistration, ProvidedValue],
    tool_order: Sequence[str] | None,
    left_out: Collection[str],
) -> Assembly:
    """The assembly the waterfall starts from: the plan's parts with their values (the
    static ones made once a plan, unless a provider was left out)."""
    if left_out:  # made from the entries that are left
        return Assembly(
            sections=[
                Part(e.name, part_text(e, values)) for e in plan.sections if e.id not in left_out
            ],
            contexts=[
                Part(e.name, part_text(e, values)) for e in plan.contexts if e.id not in left_out
            ],
            tools=_collect_tools(plan.tools, values, tool_order, left_out),
            variables={e.name: _variable(e, values) for e in plan.variables},
        )
    made = plan.made
    if not isinstance(made, _Made):
        made = plan.made = _Made.of(plan, tool_order)
    return Assembly(
        sections=[
            p if isinstance(p, Part) else Part(p.name, part_text(p, values)) for p in made.sections
        ],
        contexts=[
            p if isinstance(p, Part) else Part(p.name, part_text(p, values)) for p in made.contexts
        ],
        tools=list(made.tools)
        if made.tools is not None
        else _collect_tools(plan.tools, values, tool_order, left_out),
        variables={e.name: _variable(e, values) for e in plan.variables},
    )


@dataclass(slots=True)
class _Made:
    """A plan's parts made once: a static entry's part, or the dynamic entry itself; the
    ordered tools when no tool provider is dynamic (None: collected at each assembly)."""

    sections: list[Part | SectionRegistration]
    contexts: list[Part | ContextRegistration]
    tools: list[Tool] | None

    @classmethod
    def of(cls, plan: Plan, tool_order: Sequence[str] | None) -> _Made:
        static = all(not isinstance(entry.value, Dynamic) for entry in plan.tools)
        return cls(
            sections=[_made_part(entry) for entry in plan.sections],
            contexts=[_made_part(entry) for entry in plan.contexts],
            tools=_collect_tools(plan.tools, {}, tool_order) if static else None,
        )


E = TypeVar("E", SectionRegistration, ContextRegistration)


def _made_part(entry: E) -> Part | E:
    return entry if isinstance(entry.value, Dynamic) else Part(entry.name, part_text(entry, {}))


def resolved(entry: ValueRegistration, values: Mapping[ValueRegistration, ProvidedValue]) -> object:
    """The entry's value in this assembly: as registered, or as its provider answered
    (None when it was not asked: disposed while the assembly ran)."""
    return values.get(entry) if isinstance(entry.value, Dynamic) else entry.value


def part_text(
    entry: SectionRegistration | ContextRegistration,
    values: Mapping[ValueRegistration, ProvidedValue],
) -> str:
    text = resolved(entry, values)
    return text if isinstance(text, str) else ""


def _variable(
    entry: VariableRegistration, values: Mapping[ValueRegistration, ProvidedValue]
) -> str | None:
    value = resolved(entry, values)
    return value if isinstance(value, str) else None


def _collect_tools(
    providers: list[ToolsRegistration],
    values: Mapping[ValueRegistration, ProvidedValue],
    tool_order: Sequence[str] | None,
    left_out: Collection[str] = (),
) -> list[Tool]:
    collected: list[Tool] = []
    known: list[str] = []
    for entry in providers:
        source = resolved(entry, values)
        if not isinstance(source, ToolSet):
            continue  # disposed before it was asked
        collected.extend(source.schemas)
        known.extend(source.known())
    if any(tool.name == TOOL_ORDER_REST for tool in collected):
        raise errors.reserved_tool_name(TOOL_ORDER_REST)
    # A skipped provider's names are unknown: the order is then checked against none.
    if tool_order is not None and not any(entry.id in left_out for entry in providers):
        check_known(tool_order, known)
    return order_tools(collected, tool_order)
