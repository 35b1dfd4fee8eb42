"""Reports kept per history key: what the next report compares with, and how often it broke.

A key is the assembly's scope unless the caller names one (`report_key`, e.g.
one per conversation), so two agents sharing a scope need not see each
other's assemblies as breaks. Everything is bounded: `depth` recent reports
per key, `max_keys` keys and `max_bytes` of memory (prefix text, diffs, records, the
first `MAX_SKIPPED` steps each report went on without and the counts of all of them by
kind and reason); the least recently reported
keys go first, and the sidecar remembers (up to `4 * max_keys`) which keys it evicted
so it never calls them new.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from typing import Literal

from ..registry import Kind, Skipped
from .values import MAX_SKIPPED, Layout, Previous, Report, Size

MAX_BREAKERS = 16  # parts counted per key; the least counted goes to make room
DEFAULT_MAX_BYTES = 64 * 1024 * 1024  # limits.max_report_history_bytes
_KEY_BYTES = 4096  # a key's own objects: its history, counts, breakers, the deque
_ENTRY_BYTES = 400  # one summarised report (a HistoryEntry and its Sizes)
MAX_SKIPPED_MESSAGE = 240  # characters of a kept step's message
_STEP_BYTES = 120  # a kept Skipped and its slot, besides its name and message
_COUNT_BYTES = 100  # a SkippedCount and its slot, besides its reason


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
    has_previous: bool
    first_changed: str
    reason: str
    prefix: Size
    stable_bytes: int
    stable_tokens: int | None
    recomputed: Size
    observed_cached_tokens: int | None = None
    observed_prompt_tokens: int | None = None
    at: float = field(default_factory=time.time)  # when it was reported (Unix seconds)
    skipped: tuple[Skipped, ...] = ()  # the first MAX_SKIPPED steps it went on without
    # all of them by kind and reason (at most a pair per provider kind or listener and reason)
    skipped_counts: tuple[SkippedCount, ...] = ()

    @property
    def broke(self) -> bool:
        return self.has_previous and bool(self.reason)

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
        if kept is None:
            kept = KeyHistory(previous=None, recent=deque(maxlen=self.depth))
            self._keys[key] = kept
            self._evicted.pop(key, None)
            self._bytes += _KEY_BYTES + self.depth * _ENTRY_BYTES
        self._keys.move_to_end(key)
        if kept.previous is not None:
            self._bytes -= kept.previous.memory()
        kept.previous = previous
        self._bytes += previous.memory()
        entry = _history_entry(kept.reports + 1, revision, report)
        dropped = _count(kept, entry)
        if len(kept.recent) == kept.recent.maxlen:
            self._bytes -= _skipped_bytes(kept.recent[0])
        kept.recent.append(entry)
        self._bytes += _skipped_bytes(entry)
        if entry.broke:
            stability = report.stability
            if kept.last_break is not None:
                self._bytes -= sys.getsizeof(kept.last_break.diff)
            kept.last_break = Break(
                sequence=entry.sequence,
                at=entry.at,
                first_changed=entry.first_changed,
                reason=entry.reason,
                diff=stability.diff,
            )
            self._bytes += sys.getsizeof(stability.diff)
        self.version += 1
        return Remembered(
            entry=entry, forgotten_keys=self._make_room(key), forgotten_breakers=dropped
        )

    def observe(self, key: HistoryKey, cached: int, prompt: int | None) -> HistoryEntry | None:
        """Attach what the model server said to the key's latest report; None without one."""
        kept = self._keys.get(key)
        if kept is None or not kept.recent:
            return None
        entry = replace(
            kept.recent[-1], observed_cached_tokens=cached, observed_prompt_tokens=prompt
        )
        kept.recent[-1] = entry
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
            self._bytes -= _kept_bytes(kept, self.depth)
            forgotten.append((key, list(kept.breakers)))
            self._evicted[key] = None
            while len(self._evicted) > 4 * self.max_keys:
                self._evicted.popitem(last=False)
        return forgotten


def _kept_bytes(kept: KeyHistory, depth: int) -> int:
    """What one key's history counts against the budget (as `remember` added it)."""
    previous = 0 if kept.previous is None else kept.previous.memory()
    diff = 0 if kept.last_break is None else sys.getsizeof(kept.last_break.diff)
    skipped = sum(_skipped_bytes(entry) for entry in kept.recent)
    return _KEY_BYTES + depth * _ENTRY_BYTES + previous + diff + skipped


def _skipped_bytes(entry: HistoryEntry) -> int:
    """What an entry's kept steps and counts count against the budget, beyond `_ENTRY_BYTES`."""
    steps = sum(
        _STEP_BYTES + sys.getsizeof(step.name) + sys.getsizeof(step.message)
        for step in entry.skipped
    )
    return steps + sum(_COUNT_BYTES + sys.getsizeof(c.reason) for c in entry.skipped_counts)


def _history_entry(sequence: int, revision: int, report: Report) -> HistoryEntry:
    stability = report.stability
    return HistoryEntry(
        sequence=sequence,
        revision=revision,
        layout=report.layout,
        has_previous=stability.has_previous,
        first_changed=stability.first_changed,
        reason=stability.reason,
        prefix=stability.prefix,
        stable_bytes=stability.stable_bytes,
        stable_tokens=stability.stable_tokens,
        recomputed=stability.recomputed,
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
    if entry.recomputed.tokens is not None:
        kept.recomputed_tokens = (kept.recomputed_tokens or 0) + entry.recomputed.tokens
    kept.recomputed_bytes += entry.recomputed.bytes
    if not entry.broke:
        return []
    kept.breaks += 1
    dropped = []
    if entry.first_changed not in kept.breakers and len(kept.breakers) >= MAX_BREAKERS:
        least = min(kept.breakers, key=lambda part: (kept.breakers[part], part))
        del kept.breakers[least]
        dropped.append(least)
    kept.breakers[entry.first_changed] = kept.breakers.get(entry.first_changed, 0) + 1
    return dropped
