"""Reports kept per history key: what the next report compares with, and how often it broke.

A key is the assembly's scope unless the caller names one (`report_key`, e.g.
one per conversation), so two agents sharing a scope need not see each
other's assemblies as breaks. Everything is bounded: `depth` recent reports
per key, `max_keys` keys and `max_bytes` of memory (prefix text, diffs, records with
their reasons and the steps those name, the first `MAX_SKIPPED` steps each report went on
without and the counts of all of them by kind and reason, each counted as Python holds
it); the least recently reported keys go first, and the sidecar remembers (up to
`4 * max_keys`) which keys it evicted so it never calls them new.
"""

from __future__ import annotations

import enum
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Literal

from ..registry import Kind, Skipped
from .values import MAX_SKIPPED, Layout, PrefixStability, Previous, Report
from .words import Named

MAX_BREAKERS = 16  # parts counted per key; the least counted goes to make room
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # limits.max_report_history_bytes
_KEY_BYTES = 4096  # a key's own objects: its KeyHistory, the deque, the dicts' slots
MAX_SKIPPED_MESSAGE = 240  # characters of a kept step's message


@dataclass(frozen=True, slots=True)
class HistoryKey:
    """Whose history: a scope (None: the global one) or a key the caller named."""

    kind: Literal["scope", "key"]
    name: str | None

    def labels(self) -> tuple[str, str]:
        """Its metric labels: key_kind and key."""
        return (self.kind, self.name or "")

    def describe(self) -> str:
        if self.kind == "key":
            return f'key "{self.name}"'
        return f'scope "{self.name}"' if self.name else "the global scope"


@dataclass(frozen=True, slots=True)
class SkippedCount:
    """How many steps of one kind a reported assembly went on without for one reason."""

    kind: Kind
    reason: str
    count: int


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One reported assembly, summarised; `observed_*` arrive later from the model server."""

    sequence: int  # 1 for the key's first report
    revision: int
    layout: Layout
    seen: PrefixStability
    observed_cached_tokens: int | None = None
    observed_prompt_tokens: int | None = None
    at: float = field(default_factory=time.time)  # when it was reported (Unix seconds)
    skipped: tuple[Skipped, ...] = ()  # the first MAX_SKIPPED steps it went on without
    # all of them by kind and reason (at most a pair per provider kind or listener and reason)
    skipped_counts: tuple[SkippedCount, ...] = ()

    @property
    def broke(self) -> bool:
        return self.seen.broke

    @property
    def skipped_count(self) -> int:
        """All the steps it went on without."""
        return sum(counted.count for counted in self.skipped_counts)


@dataclass(frozen=True, slots=True)
class Break:
    """The latest report of a key that broke its prefix, with the diff of the part."""

    sequence: int
    at: float
    first_changed: str
    reason: str
    diff: str
    steps: tuple[Named, ...] = ()  # where `reason` names each listener and rule (shown.py)


@dataclass
class KeyHistory:
    """Everything kept for one key."""

    previous: Previous | None
    recent: deque[HistoryEntry]
    reports: int = 0
    breaks: int = 0
    breakers: dict[str, int] = field(default_factory=dict)  # first_changed -> breaks
    recomputed_bytes: int = 0
    recomputed_tokens: int | None = None
    last_break: Break | None = None
    # What each of its parts counts against the budget (`_held_bytes`, Previous.memory):
    own_bytes: int = _KEY_BYTES
    previous_bytes: int = 0
    entry_bytes: deque[int] = field(default_factory=deque)  # each of `recent`'s, in order
    break_bytes: int = 0
    breaker_bytes: int = 0  # the breakers' names
    frozen_since: int | None = None  # the report that froze its tools (tool_order.Freeze)

    @property
    def bytes(self) -> int:
        """What it counts against the history's budget: everything it keeps."""
        return (
            self.own_bytes
            + self.previous_bytes
            + sum(self.entry_bytes)
            + self.break_bytes
            + self.breaker_bytes
        )

    def top_breakers(self) -> list[tuple[str, int]]:
        return sorted(self.breakers.items(), key=lambda item: (-item[1], item[0]))


@dataclass(frozen=True, slots=True)
class Remembered:
    """What remembering one report did: its entry, and what was dropped to make room."""

    entry: HistoryEntry
    forgotten_keys: list[tuple[HistoryKey, list[str]]]  # each with the parts it counted
    forgotten_breakers: list[str]  # of this key


class ReportHistory:
    """The history of every key, bounded in keys, depth and bytes."""

    def __init__(
        self, depth: int = 8, max_keys: int = 1024, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.depth = depth
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        self._keys: OrderedDict[HistoryKey, KeyHistory] = OrderedDict()
        self._evicted: OrderedDict[HistoryKey, None] = OrderedDict()
        self._bytes = 0
        self.version = 0  # grows at every report and usage: watchers see something new

    @property
    def bytes(self) -> int:
        """What the kept histories count against `max_bytes`."""
        return self._bytes

    def history_keys(self) -> list[HistoryKey]:
        """The keys kept, the most recently reported last."""
        return list(self._keys)

    def previous(self, key: HistoryKey) -> tuple[Previous | None, bool]:
        """What the key's next report compares with, and whether its history was evicted."""
        kept = self._keys.get(key)
        if kept is None:
            return None, key in self._evicted
        return kept.previous, False

    def get(self, key: HistoryKey) -> tuple[KeyHistory | None, bool]:
        """The key's history, and whether an earlier one was evicted."""
        kept = self._keys.get(key)
        return kept, kept is None and key in self._evicted

    def remember(
        self, key: HistoryKey, report: Report, previous: Previous, revision: int
    ) -> Remembered:
        """Keep `report` (and `previous` to compare the next with) as the key's latest."""
        kept = self._keys.get(key)
        counted = 0 if kept is None else kept.bytes  # what it counted until now
        if kept is None:
            kept = KeyHistory(
                previous=None,
                recent=deque(maxlen=self.depth),
                own_bytes=_KEY_BYTES + _held_bytes(key),
                entry_bytes=deque(maxlen=self.depth),
            )
            self._keys[key] = kept
            self._evicted.pop(key, None)
        self._keys.move_to_end(key)
        kept.previous = previous
        kept.previous_bytes = previous.memory()
        entry = _history_entry(kept.reports + 1, revision, report)
        dropped = _count(kept, entry)
        kept.recent.append(entry)
        kept.entry_bytes.append(_held_bytes(entry))  # the oldest's goes with it
        if entry.broke:
            kept.last_break = Break(
                sequence=entry.sequence,
                at=entry.at,
                first_changed=entry.seen.first_changed,
                reason=entry.seen.reason,
                diff=report.stability.diff,
                steps=entry.seen.steps,
            )
            kept.break_bytes = _held_bytes(kept.last_break)  # its texts counted here too
        self._bytes += kept.bytes - counted
        self.version += 1
        return Remembered(
            entry=entry, forgotten_keys=self._make_room(key), forgotten_breakers=dropped
        )

    def frozen_since(self, key: HistoryKey) -> int | None:
        """The report (its sequence) that froze the key's tools; None when they are not."""
        kept = self._keys.get(key)
        return None if kept is None else kept.frozen_since

    def freeze(self, key: HistoryKey, since: int) -> None:
        """Freeze the key's tools as its latest report (`since`) has them; it must have one."""
        self._keys[key].frozen_since = since

    def release(self, key: HistoryKey) -> None:
        """Release the key's tools (nothing when they are not frozen or it has no history)."""
        kept = self._keys.get(key)
        if kept is not None:
            kept.frozen_since = None

    def observe(self, key: HistoryKey, cached: int, prompt: int | None) -> HistoryEntry | None:
        """Attach what the model server said to the key's latest report; None without one."""
        kept = self._keys.get(key)
        if kept is None or not kept.recent:
            return None
        entry = replace(
            kept.recent[-1], observed_cached_tokens=cached, observed_prompt_tokens=prompt
        )
        kept.recent[-1] = entry
        counted = _held_bytes(entry)
        self._bytes += counted - kept.entry_bytes[-1]
        kept.entry_bytes[-1] = counted
        self.version += 1
        return entry

    def _make_room(self, keep: HistoryKey) -> list[tuple[HistoryKey, list[str]]]:
        forgotten = []
        while len(self._keys) > 1 and (
            len(self._keys) > self.max_keys or self._bytes > self.max_bytes
        ):
            key, kept = self._keys.popitem(last=False)
            if key == keep:  # never the key just reported
                self._keys[key] = kept
                continue
            self._bytes -= kept.bytes
            forgotten.append((key, list(kept.breakers)))
            self._evicted[key] = None
            while len(self._evicted) > 4 * self.max_keys:
                self._evicted.popitem(last=False)
        return forgotten


def _held_bytes(value: HistoryKey | HistoryEntry | Break) -> int:
    """What `value` holds as Python holds it: sys.getsizeof of every object it reaches
    through dataclass fields and tuples (texts, sizes, numbers, kept steps), each once;
    enum members are everyone's, so not counted. An object two values share (a reason
    an entry and the last break both keep) is counted in each."""
    held: dict[int, object] = {}
    reach: list[object] = [value]
    while reach:
        each = reach.pop()
        if each is None or isinstance(each, enum.Enum) or id(each) in held:
            continue
        held[id(each)] = each
        if isinstance(each, tuple):
            reach.extend(each)
        elif is_dataclass(each):
            names = _FIELDS.get(type(each))
            if names is None:
                names = _FIELDS[type(each)] = tuple(f.name for f in fields(each))
            reach.extend(getattr(each, name) for name in names)
    return sum(map(sys.getsizeof, held.values()))


_FIELDS: dict[type, tuple[str, ...]] = {}  # each dataclass's field names, looked up once


def _history_entry(sequence: int, revision: int, report: Report) -> HistoryEntry:
    return HistoryEntry(
        sequence=sequence,
        revision=revision,
        layout=report.layout,
        seen=report.stability.seen,
        skipped=tuple(
            replace(step, message=step.message[:MAX_SKIPPED_MESSAGE])
            for step in report.skipped[:MAX_SKIPPED]
        ),
        skipped_counts=_skipped_counts(report.skipped),
    )


def _skipped_counts(steps: tuple[Skipped, ...]) -> tuple[SkippedCount, ...]:
    """The steps counted by kind and reason, each pair where it was first skipped."""
    counted: dict[tuple[Kind, str], int] = {}
    for step in steps:
        counted[step.kind, step.reason] = counted.get((step.kind, step.reason), 0) + 1
    return tuple(SkippedCount(kind, reason, count) for (kind, reason), count in counted.items())


def _count(kept: KeyHistory, entry: HistoryEntry) -> list[str]:
    """Add `entry` to the key's counts; returns the breakers dropped to stay bounded."""
    kept.reports += 1
    if entry.seen.recomputed.tokens is not None:
        kept.recomputed_tokens = (kept.recomputed_tokens or 0) + entry.seen.recomputed.tokens
    kept.recomputed_bytes += entry.seen.recomputed.bytes
    if not entry.broke:
        return []
    kept.breaks += 1
    dropped = []
    if entry.seen.first_changed not in kept.breakers and len(kept.breakers) >= MAX_BREAKERS:
        least = min(kept.breakers, key=lambda part: (kept.breakers[part], part))
        del kept.breakers[least]
        kept.breaker_bytes -= sys.getsizeof(least)
        dropped.append(least)
    if entry.seen.first_changed not in kept.breakers:
        kept.breaker_bytes += sys.getsizeof(entry.seen.first_changed)
    kept.breakers[entry.seen.first_changed] = kept.breakers.get(entry.seen.first_changed, 0) + 1
    return dropped
