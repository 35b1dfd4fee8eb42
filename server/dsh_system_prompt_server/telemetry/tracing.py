"""OpenTelemetry traces: a server span per RPC, a child span per provider request and
listener hop, and their W3C trace context handed to the client that answers.

Off unless the standard OTEL_* variables name an exporter (OTEL_TRACES_EXPORTER=otlp,
or an OTLP endpoint); then spans go over OTLP/gRPC as those variables say. Off, the
sidecar intercepts no call for it and its spans are `nullcontext()`s: nothing per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, MutableMapping
from typing import Any, Protocol, TypeVar

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from .logs import logger

_log = logger("tracing")
SERVICE = "dsh-system-prompt"
B = TypeVar("B", bound=Callable[..., Coroutine[Any, Any, Any]])


class _Method(Protocol):
    """What a span names of the method it is of (wire.handlers.Method)."""

    @property
    def path(self) -> str: ...


class Tracing:
    """The sidecar's tracer, the server span around each call, and the spans around hops."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self._tracer = provider.get_tracer("dsh_system_prompt_server")

    def around(self, method: _Method, behaviour: B) -> B:
        """The `tracing` interception: each call of `method` a server span named for its path,
        for the whole call (a stream's life too), the child of the caller's span when the
        call carries W3C `traceparent` metadata, ended with the call's status."""
        tracer, path = self._tracer, method.path
        service, _, name = path[1:].partition("/")
        attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        async def traced(request: Any, context: Any) -> Any:
            parent = propagate.extract(dict(context.invocation_metadata() or ()))
            with tracer.start_as_current_span(
                path,
                parent,
                kind=trace.SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,  # an abort is an exception: its status says it
                set_status_on_exception=False,
            ) as span:
                try:
                    response = await behaviour(request, context)
                except asyncio.CancelledError:
                    _end(span, grpc.StatusCode.CANCELLED)
                    raise
                except BaseException:  # an abort (its code set), else a failure gRPC says
                    _end(span, context.code() or grpc.StatusCode.UNKNOWN)
                    raise
                _end(span, context.code())
                return response

        return traced  # type: ignore[return-value]

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


def _end(span: trace.Span, code: grpc.StatusCode | None) -> None:
    """Say the call's status on its span: its code, and an error unless OK."""
    code = code or grpc.StatusCode.OK
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(trace.StatusCode.ERROR, code.name)
