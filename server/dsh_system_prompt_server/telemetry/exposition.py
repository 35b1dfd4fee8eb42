"""Prometheus over the sidecar's counts: a collector that reads them at each scrape, its
registry, and the /metrics endpoint. The one module that imports prometheus_client, loaded
only when something asks for the registry (`metrics_listen`, a test reading a sample)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .counts import Family, Reading, Timings

Families = Callable[[], Sequence[Timings | Family | Reading]]


class _Counts(Collector):
    """Every family `families()` gives (`Metrics.families`), as prometheus_client's own
    metrics would show it: a counter's `_total` and `_created` samples, a gauge's value, a
    histogram's buckets."""

    def __init__(self, families: Families) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for family in self._families():
            if isinstance(family, Timings):
                yield _histogram(family)
            elif isinstance(family, Reading):
                yield GaugeMetricFamily(family.name, family.documentation, value=family.read())
            else:
                yield _family(family)


def _family(family: Family) -> Metric:
    labels = list(family.labelnames)
    metric: CounterMetricFamily | GaugeMetricFamily
    if family.kind == "counter":
        metric = CounterMetricFamily(family.name, family.documentation, labels=labels)
        for values, value, created in family.series():
            metric.add_metric(list(values), value, created=created)
        return metric
    metric = GaugeMetricFamily(family.name, family.documentation, labels=labels)
    for values, value, _ in family.series():
        metric.add_metric(list(values), value)
    return metric


def _histogram(timings: Timings) -> Metric:
    # Scraped from the metrics thread: a count may be one call ahead of the sum.
    counts, total = list(timings.counts), timings.sum
    bounds = [repr(bound) for bound in timings.bounds] + ["+Inf"]  # as Histogram names them
    cumulative = [float(count) for count in itertools.accumulate(counts)]
    buckets = list(zip(bounds, cumulative, strict=True))
    return HistogramMetricFamily(
        timings.name, timings.documentation, buckets=buckets, sum_value=total
    )


def registry_of(families: Families) -> CollectorRegistry:
    """A registry of its own reading `families()` (never the process-wide default one)."""
    registry = CollectorRegistry()
    registry.register(_Counts(families))
    return registry


def serve(registry: CollectorRegistry, host: str, port: int) -> None:
    """Serve /metrics on host and port in a background thread."""
    start_http_server(port, addr=host, registry=registry)
