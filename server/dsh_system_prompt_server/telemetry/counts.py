"""The counts the sidecar keeps for its metrics, as plain Python: a counter or gauge family
(a value per label values), a gauge read from a function, a histogram of timings. Counting
is a dict entry added to, with no lock (only the event loop counts); a scrape, from another
thread, copies before it reads."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence


class Family:
    """A metric family: its name, help text and label names, and a value per label values
    (read by the scrape from another thread: it copies them, it never iterates them live)."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}
        self.created: dict[tuple[str, ...], float] = {}  # when each series was first counted
        if not self.labelnames:  # an unlabeled family has its one series from the start
            self._begin(())

    def labels(self, *values: str) -> Series:
        return Series(self, tuple(str(value) for value in values))

    def inc(self, amount: float = 1.0) -> None:
        """Add to the unlabeled series."""
        self.values[()] += amount

    def remove(self, *values: str) -> None:
        """Drop one series; KeyError when it was never counted."""
        del self.values[values]
        self.created.pop(values, None)

    def series(self) -> list[tuple[tuple[str, ...], float, float | None]]:
        """Each series' label values, value and creation time, copied at once."""
        values, created = dict(self.values), dict(self.created)
        return [(labels, value, created.get(labels)) for labels, value in values.items()]

    def _begin(self, labels: tuple[str, ...]) -> None:
        self.values[labels] = 0.0
        self.created[labels] = time.time()


class Level(Family):
    """A gauge family: a value set, not added to."""

    kind = "gauge"

    def _begin(self, labels: tuple[str, ...]) -> None:
        self.values[labels] = 0.0


class Reading:
    """A gauge read live from a function at every scrape."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.read: Callable[[], float] = lambda: 0.0

    def set_function(self, read: Callable[[], float]) -> None:
        self.read = read


class Series:
    """One series of a family, by its label values."""

    __slots__ = ("_family", "_labels")

    def __init__(self, family: Family, labels: tuple[str, ...]) -> None:
        self._family, self._labels = family, labels

    def inc(self, amount: float = 1.0) -> None:
        family = self._family
        if self._labels not in family.values:
            family._begin(self._labels)
        family.values[self._labels] += amount

    def set(self, value: float) -> None:
        family = self._family
        if self._labels not in family.values:
            family._begin(self._labels)
        family.values[self._labels] = float(value)


class Timings:
    """A histogram observed by the event loop alone, so without a lock: `observe` is one
    bucket found and two additions (prometheus_client's Histogram takes ~2-5 µs a call,
    a fifth of a kept Assemble answer's whole cost)."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(bound) for bound in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)
