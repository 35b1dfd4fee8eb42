"""Samples, percentiles, interleaved timing and the stopwatch of one operation."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

Operation = Callable[[], Awaitable[object]]
T = TypeVar("T")
ORDER_SEED = 35


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
    """Time each operation `iterations` times, in a new random order each round, after
    `warmup` rounds.

    Shuffled, not rotated: rotated, each operation always ran right after the same other
    one, and what that one left behind (a bare round trip after a large assemble read
    1.16-1.27 round trips rotated, 0.79-0.80 shuffled) weighed on it alone; shuffled, noise
    on the machine and each operation's neighbours hit all of them alike.
    """
    names = list(operations)
    durations: dict[str, list[int]] = {name: [] for name in names}
    order = random.Random(ORDER_SEED)  # the same orders from one run to the next
    for round_ in range(warmup + iterations):
        order.shuffle(names)
        for name in names:
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
