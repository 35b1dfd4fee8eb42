"""OpenTelemetry traces: a server span per RPC, a child span per provider request and
listener hop, and their W3C trace context handed to the client that answers.

Off unless the standard OTEL_* variables name an exporter (OTEL_TRACES_EXPORTER=otlp,
or an OTLP endpoint); then spans go over OTLP/gRPC as those variables say. Off, the
sidecar installs no interceptor and its spans are `nullcontext()`s: nothing per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import grpc.aio
from opentelemetry import propagate, trace
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from .logs import logger

_log = logger("tracing")
# Reader/writer streams: the instrumentation's wrapper only iterates response generators.
_STREAMS = ("OpenSession", "Listen")
SERVICE = "dsh-system-prompt"


class Tracing:
    """The sidecar's tracer, its interceptors, and the spans it starts around hops."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("dsh_system_prompt_server")

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """The instrumentation's server span for every unary call and the change stream,
        and one span for the life of each session or listener stream."""
        streams = filters.any_of(*(filters.method_name(name) for name in _STREAMS))
        return [
            aio_server_interceptor(self.provider, filter_=filters.negate(streams)),  # type: ignore[no-untyped-call]
            _StreamSpans(self._tracer),
        ]

    @contextlib.contextmanager
    def hop(self, name: str, carrier: MutableMapping[str, str]) -> Iterator[None]:
        """A client span for one hop to a client (`name`), its context written to `carrier`."""
        with self._tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT):
            propagate.inject(carrier)
            yield

    async def shutdown(self, timeout_s: float) -> bool:
        """Export what is buffered, then stop; give up after `timeout_s` (a collector that
        never answers would hold the exit for the exporter's own, longer, timeout).
        False when it gave up: the spans still buffered are lost."""
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def shut() -> None:
            try:
                self.provider.shutdown()
            finally:
                loop.call_soon_threadsafe(done.set)

        # A daemon thread, not the loop's executor: the process must not wait for it at exit.
        threading.Thread(target=shut, name="tracing-shutdown", daemon=True).start()
        try:
            await asyncio.wait_for(done.wait(), timeout_s)
        except TimeoutError:
            _log.warning("span export still pending after %gs: dropped", timeout_s)
            return False
        return True


def tracing_from_env(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """Tracing as the OTEL_* variables configure it, or None when they do not ask for it."""
    env = os.environ if environ is None else environ
    if not enabled(env):
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter,  # loaded only when tracing: it pulls in more of grpc
    )

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


class _StreamSpans(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A server span for the life of each OpenSession or Listen stream."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        method = str(details.method)
        if handler is None or not method.endswith(tuple(f"/{name}" for name in _STREAMS)):
            return handler
        behavior = handler.stream_stream
        tracer = self._tracer

        async def traced(requests: Any, context: Any) -> Any:
            carrier = dict(context.invocation_metadata() or ())
            parent = propagate.extract(carrier)
            with tracer.start_as_current_span(method, parent, kind=trace.SpanKind.SERVER):
                return await behavior(requests, context)

        return grpc.stream_stream_rpc_method_handler(
            traced, handler.request_deserializer, handler.response_serializer
        )
