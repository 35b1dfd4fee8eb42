"""Samples, percentiles, interleaved timing and the stopwatch of one operation."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

Operation = Callable[[], Awaitable[object]]
T = TypeVar("T")


@dataclass(frozen=True)
class Samples:
    """Durations of one operation, in nanoseconds."""

    ns: tuple[int, ...]

    @classmethod
    def of(cls, ns: list[int]) -> Samples:
        return cls(tuple(sorted(ns)))

    def percentile(self, p: float) -> float:
        """The p-th percentile (0-100), interpolated between the closest ranks."""
        if not self.ns:
            return math.nan
        rank = (len(self.ns) - 1) * p / 100
        low = math.floor(rank)
        high = min(low + 1, len(self.ns) - 1)
        return self.ns[low] + (self.ns[high] - self.ns[low]) * (rank - low)

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    def summary_us(self) -> dict[str, float | int]:
        """p50/p99/mean in microseconds, for the JSON details."""
        mean = sum(self.ns) / len(self.ns) if self.ns else math.nan
        return {
            "n": len(self.ns),
            "p50_us": round(self.p50 / 1000, 2),
            "p99_us": round(self.p99 / 1000, 2),
            "mean_us": round(mean / 1000, 2),
        }


async def interleaved(
    operations: Mapping[str, Operation], iterations: int, warmup: int
) -> dict[str, Samples]:
    """Time each operation `iterations` times, A, B, C, B, C, A, ... after `warmup` rounds.

    The order rotates every round, so that no operation always runs right
    after the same other one; noise on the machine hits all of them alike.
    """
    names = list(operations)
    durations: dict[str, list[int]] = {name: [] for name in names}
    for round_ in range(warmup + iterations):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            operation = operations[name]
            start = time.perf_counter_ns()
            await operation()
            elapsed = time.perf_counter_ns() - start
            if round_ >= warmup:
                durations[name].append(elapsed)
    return {name: Samples.of(values) for name, values in durations.items()}


@dataclass
class Stopwatch:
    """Durations of one operation timed call by call, between untimed steps of its own."""

    ns: list[int] = field(default_factory=list)

    async def timed(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Await `operation()`, keep how long it took, and give back its result."""
        start = time.perf_counter_ns()
        result = await operation()
        self.ns.append(time.perf_counter_ns() - start)
        return result

    def samples(self) -> Samples:
        return Samples.of(self.ns)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.inf
