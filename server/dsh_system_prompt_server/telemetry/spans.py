"""The OpenTelemetry side of traces: the `Tracing` the sidecar holds when an exporter is
configured, its server span around each call and its client spans around hops. Loaded only
then (`tracing.py` says when), so a sidecar that does not trace never imports OpenTelemetry."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator, MutableMapping
from typing import Any, Protocol, TypeVar

import grpc
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider

from .logs import logger

_log = logger("tracing")
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

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """An internal span for one step the sidecar runs itself (a rule, `name`)."""
        with self._tracer.start_as_current_span(name, kind=trace.SpanKind.INTERNAL):
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


def _end(span: trace.Span, code: grpc.StatusCode | None) -> None:
    """Say the call's status on its span: its code, and an error unless OK."""
    code = code or grpc.StatusCode.OK
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(trace.StatusCode.ERROR, code.name)
