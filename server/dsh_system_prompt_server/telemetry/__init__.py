"""What the sidecar tells its operator about itself: Prometheus metrics, logs, traces.

Belongs here: metric families and their labels, the log format, OpenTelemetry spans and their
W3C context. It imports nothing of the package but `registry/` and `reports/` (the metrics
of a report follow its values), so every layer above may record into it.
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
