"""Spans around this client's providers and listeners, in the Assemble caller's trace.

Only with OpenTelemetry importable (`dsh-system-prompt[otel]`) and a trace context
from the sidecar (it traces): the span joins the sidecar's hop span, which joins the
caller's. The application's own tracer provider records it (none set: no-op). The
caller's side: Assemble carries the current span's context to the sidecar.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the otel extra is not installed: no spans, no cost
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

_TRACER = "dsh_system_prompt"


def span(name: str, carrier: Mapping[str, str]) -> Any:
    """A span named `name`, child of the context in `carrier`; nothing when there is none."""
    if trace is None or not carrier:
        return contextlib.nullcontext()
    parent = propagate.extract(carrier)
    return trace.get_tracer(_TRACER).start_as_current_span(name, parent, kind=trace.SpanKind.SERVER)


def outgoing() -> list[tuple[str, str]] | None:
    """Metadata carrying the current span's context to the sidecar; None without one."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())
