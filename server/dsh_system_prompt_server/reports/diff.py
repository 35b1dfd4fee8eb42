"""A short, bounded diff of a changed part, so a person sees what changed without re-running."""

from __future__ import annotations

import json
from collections.abc import Sequence

MAX_LINES = 12  # diff lines shown, context included
MAX_WIDTH = 120  # characters a line keeps, around where it first differs
_MAX_COMPARED = 200  # lines on each side handed to difflib after trimming the common ends


def bounded_diff(old: str, new: str, json_: bool = False) -> str:
    """`-`/`+` lines (one line of context) of old against new; "" when they are equal.

    With `json_`, both are compact JSON and are compared pretty-printed, key by line.
    """
    if old == new:
        return ""
    import difflib  # a prompt changed since the last report: not before

    if json_:
        old, new = _pretty(old), _pretty(new)
    before, after = old.splitlines(), new.splitlines()
    head = common_prefix(before, after)
    tail = common_prefix(before[head:][::-1], after[head:][::-1])
    start = max(0, head - 1)
    before = before[start : len(before) - max(0, tail - 1)][:_MAX_COMPARED]
    after = after[start : len(after) - max(0, tail - 1)][:_MAX_COMPARED]
    column = _first_difference(before, after)
    lines = [
        line[0] + _clip(line[1:], column)
        for line in difflib.unified_diff(before, after, lineterm="", n=1)
        if not line.startswith(("---", "+++", "@@"))
    ]
    if len(lines) > MAX_LINES:
        lines = [*lines[:MAX_LINES], f"… {len(lines) - MAX_LINES} more lines"]
    return "\n".join(lines)


def _pretty(text: str) -> str:
    if not text:
        return text
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _first_difference(before: list[str], after: list[str]) -> int:
    """The column where the first differing pair of lines differs."""
    for x, y in zip(before, after, strict=False):
        if x != y:
            return common_prefix(x, y)
    return 0


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """The length of the longest common prefix of two strings or arrays (slices compare in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:  # invariant: a[:low] == b[:low]
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _clip(line: str, column: int) -> str:
    if len(line) <= MAX_WIDTH:
        return line
    start = max(0, min(column - MAX_WIDTH // 3, len(line) - MAX_WIDTH))
    clipped = line[start : start + MAX_WIDTH]
    return ("…" if start else "") + clipped + ("…" if start + MAX_WIDTH < len(line) else "")
