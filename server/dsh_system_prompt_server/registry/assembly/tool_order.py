"""The configured model-facing tool order: its shape, its names, its application."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from dsh_system_prompt_core import TOOL_ORDER_REST, Reason

from ..errors import RegistryError, Status, unknown_tool_order_names
from ..model import Tool


def validate_tool_order(tool_order: Sequence[str]) -> tuple[str, ...]:
    """Check the shape of a configured tool order (at config load)."""
    seen: set[str] = set()
    for name in tool_order:
        if name in seen:
            raise _shape_error(f'toolOrder lists "{name}" more than once')
        seen.add(name)
    if TOOL_ORDER_REST not in seen:
        raise _shape_error(f'toolOrder must contain the "{TOOL_ORDER_REST}" rest entry')
    return tuple(tool_order)


def check_known(tool_order: Sequence[str], known: Iterable[str]) -> None:
    """Reject a tool order that lists names no provider knows."""
    known_set = set(known)
    unknown = [n for n in tool_order if n != TOOL_ORDER_REST and n not in known_set]
    if unknown:
        raise unknown_tool_order_names(unknown, sorted(known_set))


def order_tools(tools: Iterable[Tool], tool_order: Sequence[str] | None) -> list[Tool]:
    """Sort by name (stable), then place listed names and the rest entry."""
    by_name = sorted(tools, key=lambda tool: tool.name)
    if tool_order is None:
        return by_name
    listed: Collection[str] = set(tool_order)
    grouped: dict[str, list[Tool]] = {}
    for tool in by_name:
        grouped.setdefault(tool.name, []).append(tool)
    ordered: list[Tool] = []
    for entry in tool_order:
        if entry == TOOL_ORDER_REST:
            ordered.extend(tool for tool in by_name if tool.name not in listed)
        else:
            ordered.extend(grouped.get(entry, ()))
    return ordered


def _shape_error(message: str) -> RegistryError:
    return RegistryError(Status.INVALID_ARGUMENT, Reason.INVALID_TOOL_ORDER, message)
