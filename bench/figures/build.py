"""How every figure is built: `figure` makes each one (its value rounded, judged or only
reported), and over it stand the shapes most figures take: a p50 ratio, a slowdown, a
timing's percentiles and a cost in bidi round trips."""

from __future__ import annotations

from typing import Any, Literal

from ..report import Figure, Judged, X, at_most
from ..stats import Samples, ratio

# A timing's unit: nanoseconds per unit, and the digits its figure keeps.
_UNITS = {"µs": (1e3, 1), "ms": (1e6, 2)}


def figure(
    key: str,
    name: str,
    value: float,
    unit: str,
    judged: Judged | str,
    details: dict[str, Any],
    *,
    digits: int = 2,
    display: str = "",
) -> Figure:
    """The figure `key`: `value` in `unit`, rounded to `digits`; `judged` is its target and
    whether it was met (`report.at_most` and the like), or the words of a figure only
    reported; `display` is how the table shows it, when more than value and unit."""
    target, met = (judged, None) if isinstance(judged, str) else (judged["target"], judged["met"])
    return Figure(
        key=key,
        name=name,
        value=round(value, digits),
        unit=unit,
        target=target,
        met=met,
        details=details,
        display=display,
    )


def timed_ratio_details(samples: dict[str, Samples]) -> dict[str, Any]:
    """Each operation's p50, p99 and mean in microseconds, by name."""
    return {name: s.summary_us() for name, s in samples.items()}


def p50_ratio(
    samples: dict[str, Samples],
    over: str,
    under: str,
    limit: float,
    *,
    key: str,
    name: str,
    details: dict[str, Any],
) -> Figure:
    """The figure `key`: p50 of `over` / p50 of `under`, at most `limit`; every timing of
    `samples` and then `details` beside it."""
    value = ratio(samples[over].p50, samples[under].p50)
    return figure(
        key, name, value, f"{X} p50", at_most(value, limit), timed_ratio_details(samples) | details
    )


def slowdown(
    key: str, name: str, slow_ns: float, calm_ns: float, limit: float, details: dict[str, Any]
) -> Figure:
    """The figure `key`: how many times `calm_ns` an operation took under some load
    (`slow_ns`), at most `limit`; the table shows both in milliseconds."""
    value = ratio(slow_ns, calm_ns)
    shown = f"{value:.2f}x ({slow_ns / 1e6:.2f} ms / {calm_ns / 1e6:.2f} ms)"
    return figure(key, name, value, "x", at_most(value, limit, "≤ {:g}x"), details, display=shown)


def percentiles(
    key: str,
    name: str,
    samples: Samples,
    judged: Judged | str,
    details: dict[str, Any],
    *,
    unit: Literal["µs", "ms"] = "µs",
    headline: Literal[50, 99] = 50,
) -> Figure:
    """The figure `key`: the `headline` percentile of `samples` in `unit`, the other of
    p50 and p99 beside it in the table; the samples' summary first in the details."""
    per_unit, digits = _UNITS[unit]
    other = 99 if headline == 50 else 50
    value, beside = samples.percentile(headline) / per_unit, samples.percentile(other) / per_unit
    shown = f"{value:.{digits}f} {unit} p{headline}, {beside:.{digits}f} {unit} p{other}"
    details = {"samples": samples.summary_us()} | details
    return figure(
        key, name, value, f"{unit} p{headline}", judged, details, digits=digits, display=shown
    )


def round_trips(
    key: str,
    name: str,
    extra_ns: float,
    samples: dict[str, Samples],
    limit: float,
    words: str,
    details: dict[str, Any],
) -> Figure:
    """The figure `key`: `extra_ns` in bidi round trips (the p50 of `samples`'
    "bidi_round_trip"), at most `limit` (`words` say so); the timings of `samples`, the
    extra time and `details` beside it."""
    value = ratio(extra_ns, samples["bidi_round_trip"].p50)
    details = timed_ratio_details(samples) | {"extra_us": round(extra_ns / 1000, 1)} | details
    return figure(key, name, value, "round trips", at_most(value, limit, words), details)
