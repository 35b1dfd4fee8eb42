"""A tool order that keeps the prefix: each reported assembly's tools in the order the history
key's last report had them, new ones appended, rather than sorted anew.

With `tool_order_mode = "stable"`, the tools `tool_order` does not place (all of them without
one) are put, in the slots they hold in the assembled list, in the order of the key's last
report: tools it had keep their relative order, removed ones leave the others in place, and
new ones come after them (among themselves in the order the assembly gave them). The tools
`tool_order` places keep their places. The memory is the key's last kept report (`Previous`),
so it is bounded as the report history is: a key evicted, or a restart, starts over from the
sorted order. `ToolOrdering` says what was done and what sorting would have changed.

A key's tools may also be frozen (`Freeze.HOLD`) until released (`Freeze.RELEASE`, e.g. at
compaction): while frozen, a reported assembly whose tool list differs from the last
report's in names, order or bytes fails (`frozen_change` says how), and nothing is kept.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence

from ..registry import PartKind, Tool
from .values import Previous, ToolOrdering


class Freeze(enum.Enum):
    """What a reported assembly does to its key's tool freeze."""

    NONE = "none"  # nothing: a frozen key stays frozen, and the assembly is checked
    HOLD = "hold"  # freeze the tools as this assembly has them, unless frozen already
    RELEASE = "release"  # release the freeze before this assembly


def tool_prints(previous: Previous | None) -> list[tuple[str, str]]:
    """Each tool of a kept report, in order: its name and its fingerprint."""
    if previous is None:
        return []
    return [(part.name, part.fingerprint) for part in previous.parts if part.kind is PartKind.TOOL]


def frozen_change(before: Sequence[tuple[str, str]], after: Sequence[tuple[str, str]]) -> str:
    """How the tool list `after` differs from the frozen `before`, in words; "" if it does not."""
    if list(before) == list(after):
        return ""
    names_before, names_after = [name for name, _ in before], [name for name, _ in after]
    if added := [name for name in names_after if name not in set(names_before)]:
        return f'tool "{added[0]}" would be added'
    if removed := [name for name in names_before if name not in set(names_after)]:
        return f'tool "{removed[0]}" would be removed'
    if len(before) != len(after):  # the same names, one more or less of a duplicated one
        return f"the tool list would have {len(after)} tools, not {len(before)}"
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if was[0] != now[0]:
            return f'tool "{now[0]}" would move to position {index}, where "{was[0]}" is'
        if was[1] != now[1]:
            return f'tool "{now[0]}" would change'
    return "the tool list would change"  # not reached: the lists differ somewhere


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
