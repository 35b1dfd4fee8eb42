"""Building the channel: keepalive, fast reconnects, optional TLS and bearer token."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio

CHANNEL_OPTIONS = [
    # Notice a vanished sidecar within ~15 s even when no call is active.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect quickly after a sidecar restart instead of backing off for minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


@dataclass(frozen=True)
class TLS:
    """TLS to the sidecar: its CA, and a client certificate for mutual TLS."""

    root_certificates: bytes | None = None
    private_key: bytes | None = None
    certificate_chain: bytes | None = None
    server_name: str | None = None  # when the certificate names another host


Metadata = tuple[tuple[str, str], ...]


def call_metadata(token: str | None) -> Metadata:
    """What every call and stream carries: the bearer token, when there is one."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def open_channel(address: str, tls: TLS | None) -> grpc.aio.Channel:
    """A channel to `address` (HOST:PORT or unix:PATH)."""
    options: list[tuple[str, int | str]] = list(CHANNEL_OPTIONS)
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(
        tls.root_certificates, tls.private_key, tls.certificate_chain
    )
    return grpc.aio.secure_channel(address, credentials, options=options)
