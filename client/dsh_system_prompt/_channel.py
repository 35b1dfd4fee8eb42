"""The channel: keepalive, fast reconnects, optional TLS, and the bearer token on every call.

The channel outlives sessions: after a sidecar restart the same channel
reconnects and only the session is opened again. The token is added by
interceptors, once for every unary and streaming call made on the channel.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

DEFAULT_ADDRESS = "127.0.0.1:50051"
ADDRESS_VARIABLE = "DSP_ADDRESS"  # the deploy manifests set it for the agent container

CHANNEL_OPTIONS = [
    # Notice a vanished sidecar within ~15 s even when no call is active.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a sidecar restart instead of backing off for minutes. Not
    # grpc.min_reconnect_backoff_ms: gRPC takes it as each attempt's connect timeout, and at
    # 100 ms a loaded host's connects failed ("tcp handshaker shutdown"); its default is 20 s.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    # A connection of its own: gRPC would share one among a process's clients, and over
    # loopback without credentials the sidecar counts sessions per connection
    # (limits.max_sessions_per_peer).
    ("grpc.use_local_subchannel_pool", 1),
]


@dataclass(frozen=True)
class TLS:
    """TLS to the sidecar: its CA, and a client certificate for mutual TLS."""

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    server_name: str | None = None  # when the certificate names another host


def default_address() -> str:
    """`$DSP_ADDRESS` when set, else 127.0.0.1:50051."""
    return os.environ.get(ADDRESS_VARIABLE) or DEFAULT_ADDRESS


def open_channel(
    address: str | None = None, tls: TLS | None = None, token: str | None = None
) -> grpc.aio.Channel:
    """A channel to `address` (HOST:PORT or unix:PATH, default `default_address()`);
    every call on it carries `token`."""
    address = address or default_address()
    options: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
    # Without a token there is nothing to add: no interceptor, no cost per call.
    interceptors = _bearer_token(token) if token else None
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(
        tls.root_certificates, tls.private_key, tls.certificate_chain
    )
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


def _bearer_token(token: str) -> list[grpc.aio.ClientInterceptor]:
    # grpc.aio files an interceptor under its first call kind only: one object per kind.
    # The service has no client-streaming RPC, so there is no stream-unary one.
    entry = ("authorization", f"Bearer {token}")
    return [_UnaryUnary(*entry), _UnaryStream(*entry), _StreamStream(*entry)]


# The continuations start the call; what they return is the call the caller gets.
_Continuation = Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]]


class _AddsHeader:
    """Adds one metadata entry to every call it intercepts."""

    def __init__(self, key: str, value: str) -> None:
        self._entry = (key, value)

    def _with_header(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._entry)
        return details._replace(metadata=metadata)


# grpc ships no type information, so its interceptor bases are Any to mypy.


class _UnaryUnary(_AddsHeader, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(
        self, continuation: _Continuation, details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_header(details), request)


class _UnaryStream(_AddsHeader, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(
        self, continuation: _Continuation, details: grpc.aio.ClientCallDetails, request: Any
    ) -> Any:
        return await continuation(self._with_header(details), request)


class _StreamStream(_AddsHeader, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: _Continuation, details: grpc.aio.ClientCallDetails, requests: Any
    ) -> Any:
        return await continuation(self._with_header(details), requests)
