"""A rate decayed over time: how much of something (seconds of the loop, calls) a client
took lately, per second (shares.py, running.py)."""

from __future__ import annotations

import math


class Use:
    """How much one client took lately, per second: of the loop's time, seconds per
    second; of calls, calls per second. Each second's weighs less as it ages (an
    exponential decay over `window_s`)."""

    __slots__ = ("at", "rate")

    def __init__(self) -> None:
        self.rate = 0.0
        self.at = 0.0

    def now(self, now: float, window_s: float) -> float:
        """The rate at `now`, decayed since it was last added to."""
        return self.rate * math.exp((self.at - now) / window_s) if now > self.at else self.rate

    def add(self, now: float, window_s: float, amount: float) -> None:
        """Count `amount` (seconds, calls) taken at `now`."""
        self.rate = self.now(now, window_s) + amount / window_s
        self.at = now
