"""What the sidecar tells its operator about itself: Prometheus metrics, logs, traces.

Belongs here: metric families and their labels, the log format, OpenTelemetry spans and their
W3C context. It may import only the folders before it in `LAYERS` in
tests/package/test_package.py (the metrics of a report follow its values), so every floor above
may record into it.
"""

from .logs import LOGGER_NAME, Throttled, configure_logging, logger
from .metrics import Metrics
from .tracing import Tracing, hop, tracing_from_env

__all__ = [
    "LOGGER_NAME",
    "Metrics",
    "Throttled",
    "Tracing",
    "configure_logging",
    "hop",
    "logger",
    "tracing_from_env",
]
