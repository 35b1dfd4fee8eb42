"""OpenTelemetry traces: a server span per RPC, a child span per provider request and
listener hop, and their W3C trace context handed to the client that answers.

Off unless the standard OTEL_* variables name an exporter (OTEL_TRACES_EXPORTER=otlp,
or an OTLP endpoint); then spans go over OTLP/gRPC as those variables say. Off, the
sidecar intercepts no call for it and its spans are `nullcontext()`s: nothing per call,
and OpenTelemetry is never imported (the `Tracing` itself is in `spans.py`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from .logs import logger

if TYPE_CHECKING:
    from .spans import Tracing

_log = logger("tracing")
SERVICE = "dsh-system-prompt"


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the OTEL_* variables configure it, or None when they do not ask for it."""
    env = os.environ if environ is None else environ
    if not enabled(env):
        return None
    # OpenTelemetry loads here, only when tracing; the exporter pulls in more of grpc.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from .spans import Tracing

    resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    # No exit hook: the drain shuts it down, bounded (the hook would wait unbounded).
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _log.info("tracing: spans exported over OTLP/gRPC")
    return Tracing(provider)


def enabled(env: Mapping[str, str]) -> bool:
    """Asked for by OTEL_TRACES_EXPORTER=otlp or an OTLP endpoint, and not disabled."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter == "otlp"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def hop(tracing: Tracing | None, name: str, carrier: MutableMapping[str, str]) -> Any:
    """`tracing.hop(...)`, or nothing at all when the sidecar does not trace."""
    return contextlib.nullcontext() if tracing is None else tracing.hop(name, carrier)


def step_spans(tracing: Tracing | None) -> Callable[[str], Any] | None:
    """What makes a span for each step the sidecar runs itself (a rule): None when it does
    not trace, so the registry makes none."""
    return None if tracing is None else tracing.step


def __getattr__(name: str) -> Any:
    """`Tracing`, from `spans.py` on first use (PEP 562): OpenTelemetry loads with it."""
    if name == "Tracing":
        from .spans import Tracing

        return Tracing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
