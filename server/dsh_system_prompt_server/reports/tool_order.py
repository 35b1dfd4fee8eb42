"""A tool order that keeps the prefix: each reported assembly's tools in the order the history
key's last report had them, new ones appended, rather than sorted anew.

With `tool_order_mode = "stable"`, the tools `tool_order` does not place (all of them without
one) are put, in the slots they hold in the assembled list, in the order of the key's last
report: tools it had keep their relative order, removed ones leave the others in place, and
new ones come after them (among themselves in the order the assembly gave them). The tools
`tool_order` places keep their places. The memory is the key's last kept report (`Previous`),
so it is bounded as the report history is: a key evicted, or a restart, starts over from the
sorted order. `ToolOrdering` says what was done and what sorting would have changed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..registry import PartKind, Tool
from .values import Previous, ToolOrdering


def previous_tools(previous: Previous | None) -> list[str]:
    """The tool names of the key's last report, in its order (empty without one)."""
    if previous is None:
        return []
    return [part.name for part in previous.parts if part.kind is PartKind.TOOL]


def stable_order(
    tools: Sequence[Tool], placed: Collection[str], before: Sequence[str]
) -> tuple[list[Tool], ToolOrdering]:
    """`tools` (as assembled) with the ones not `placed` in the order of `before` (the last
    report's names), new ones after them; and how that differs from `tools`' order."""
    rank: dict[str, int] = {}
    for index, name in enumerate(before):
        rank.setdefault(name, index)
    new = len(rank)
    slots = [index for index, tool in enumerate(tools) if tool.name not in placed]
    # sorted() is stable: tools of one name, and new tools, keep the order they came in
    moving = sorted((tools[index] for index in slots), key=lambda t: rank.get(t.name, new))
    ordered = list(tools)
    for index, tool in zip(slots, moving, strict=True):
        ordered[index] = tool
    for index, (given, kept) in enumerate(zip(tools, ordered, strict=True)):
        if given.name != kept.name:
            return ordered, ToolOrdering(True, index, given.name, kept.name)
    return ordered, ToolOrdering(False)
