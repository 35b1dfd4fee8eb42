"""What the sidecar tells its operator about itself: Prometheus metrics, logs, traces.

Belongs here: metric families and their labels, the log format, OpenTelemetry spans and their
W3C context. It may import only the folders before it in `LAYERS` in
tests/package/test_package.py (the metrics of a report follow its values), so every floor above
may record into it.

What a configuration can leave off is not imported until it is on: prometheus_client with
`metrics_listen` (`exposition.py`), OpenTelemetry with an exporter (`spans.py`, `Tracing`
here loads it), python-json-logger with `log_format = "json"`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .logs import LOGGER_NAME, Throttled, configure_logging, logger
from .metrics import Metrics
from .tracing import hop, step_spans, tracing_from_env

if TYPE_CHECKING:
    from .spans import Tracing

__all__ = [
    "LOGGER_NAME",
    "Metrics",
    "Throttled",
    "Tracing",
    "configure_logging",
    "hop",
    "logger",
    "step_spans",
    "tracing_from_env",
]


def __getattr__(name: str) -> Any:
    """`Tracing` on first use (PEP 562): OpenTelemetry loads with it."""
    if name == "Tracing":
        from .spans import Tracing

        return Tracing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
