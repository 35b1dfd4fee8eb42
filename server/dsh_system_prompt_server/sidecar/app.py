"""Builds, starts and drains the sidecar's gRPC server."""

from __future__ import annotations

import asyncio
import errno
import resource
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from ..config import ConfigError, names
from ..guard import Shares, sharing
from ..registry import Registry
from ..rpc import ServerState, SystemPromptService
from ..telemetry import Metrics, logger
from ..wire import (
    UNIX_PREFIX,
    Intercepted,
    Interception,
    add_service,
    bind_failure,
    check_listen,
    claim_unix_socket,
    ending,
    host_and_port,
    parsing,
)
from .config import SidecarConfig, all_credentials

if TYPE_CHECKING:
    from ..admin import AdminOptions, AdminServer
    from ..guard import Authenticator, AuthInterceptor, Credential
    from ..telemetry import Tracing

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SystemPromptService"].full_name
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_log = logger("app")


@dataclass
class Sidecar:
    """A running sidecar: its server, what it serves from, and its bound address."""

    server: grpc.aio.Server
    state: ServerState
    health: health_aio.HealthServicer
    metrics: Metrics
    address: str
    config: SidecarConfig
    tracing: Tracing | None = None
    admin: AdminServer | None = None
    authenticator: Authenticator | None = None  # None: no credentials, every caller an admin
    interceptions: tuple[Interception, ...] = ()  # what every call passes, outermost first

    @property
    def registry(self) -> Registry:
        return self.state.registry

    async def drain(self) -> None:
        """SIGTERM behaviour: NOT_SERVING, refuse new calls, let in-flight ones
        finish within the grace period, then end every session and stop."""
        await self.health.enter_graceful_shutdown()
        self.state.gate.close()
        self.state.shares.stop()
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.config.shutdown_grace_s
        finished = await self.state.gate.wait_idle(self.config.shutdown_grace_s)
        if not finished:
            _log.warning("calls still in flight after %ss: cancelled", self.config.shutdown_grace_s)
        await self.server.stop(grace=None)
        if self.tracing is not None:  # export what is buffered, within what is left of the grace
            await self.tracing.shutdown(max(0.0, ends - loop.time()))
        await self.close_admin()
        _log.info("stopped")

    async def close_admin(self) -> None:
        """Stop the admin page, if it serves."""
        if self.admin is not None:
            await self.admin.close()
            self.admin = None


async def start_sidecar(
    config: SidecarConfig, listen: str = "127.0.0.1:50051", tracing: Tracing | None = None
) -> Sidecar:
    """Start serving on `listen` (HOST:PORT, port 0 for any, or unix:PATH); with
    `tracing`, every call and every hop to a client is a span."""
    raise_open_files()
    registry = Registry(config.registry)
    credentials = all_credentials(config)
    metrics = Metrics(key_labels=config.metrics_key_labels)
    authenticator, auth = _auth(credentials, registry, metrics) if credentials else (None, None)
    server = grpc.aio.server(options=server_options(config))
    state = ServerState(
        registry, config.state, metrics, tracing, dead_peer_s=config.dead_peer_timeout_s
    )
    served = Intercepted(server, interceptions(tracing, auth, state.shares))
    add_service(SystemPromptService(state), served)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, served)
    if reflection_enabled(config, listen):
        _add_reflection(served)
    port = _bind(server, listen, server_credentials(config))
    if config.metrics_listen:
        _serve_metrics(metrics, config.metrics_listen)
    address = bound_address(listen, port)
    admin = (
        await _serve_admin(state, config, address, authenticator) if config.admin_listen else None
    )
    await server.start()
    state.shares.start()  # measures how late the loop runs, for the clients' shares
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    _log.info(
        "serving on %s (tls=%s, auth=%s, tracing=%s)",
        address,
        bool(config.security.tls_cert_file),
        authenticator is not None,
        tracing is not None,
    )
    return Sidecar(
        server=server,
        state=state,
        health=health,
        metrics=metrics,
        address=address,
        config=config,
        tracing=tracing,
        admin=admin,
        authenticator=authenticator,
        interceptions=served.interceptions,
    )


def _auth(
    credentials: list[Credential], registry: Registry, metrics: Metrics
) -> tuple[Authenticator, AuthInterceptor]:
    """What checks every call's credential (the config has some: only then is it loaded)."""
    from ..guard import Authenticator, AuthInterceptor

    authenticator = Authenticator(credentials)
    auth = AuthInterceptor(authenticator, registry)
    auth.on_refused = lambda reason: metrics.refused_calls.labels(reason).inc()
    return authenticator, auth


def interceptions(
    tracing: Tracing | None, auth: AuthInterceptor | None, shares: Shares
) -> list[Interception]:
    """What every call passes through, the first outermost: its span (so a refused call is
    traced too), the status a Failure ending it makes (set, not raised, on a unary call's
    context: handlers.ending), the credential it presents, its client's share of the loop
    (a call without a valid credential, health's and reflection's charged too: to the
    anonymous share), its
    refusal without a valid credential and the policy on its request (the parse's time
    counted), then its request parsed. Tracing off, or no credentials, those are not there
    at all: nothing per call."""
    listed = [] if tracing is None else [Interception("tracing", tracing.around)]
    listed.append(Interception("status", ending))
    if auth is not None:
        listed.append(Interception("identity", auth.identifying))
    listed.append(Interception("shares", sharing(shares, anonymous=auth is not None)))
    if auth is not None:
        listed.append(Interception("auth", auth.around))
    listed.append(Interception("parsing", parsing))
    return listed


def _add_reflection(served: Intercepted) -> None:
    """Server reflection: loaded only where it is on (by default, loopback listeners only)."""
    from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

    names = (SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, served)


def _bind(server: grpc.aio.Server, listen: str, credentials: grpc.ServerCredentials | None) -> int:
    """Bind `listen` exclusively; OSError (AddressInUse when another process serves there)."""
    check_listen(listen)
    if listen.startswith(UNIX_PREFIX):
        claim_unix_socket(listen)
    try:
        if credentials is None:
            return int(server.add_insecure_port(listen))
        return int(server.add_secure_port(listen, credentials))
    except RuntimeError:  # gRPC says only "failed to bind": find out why
        raise bind_failure(listen) from None


def _serve_metrics(metrics: Metrics, listen: str) -> None:
    try:
        metrics.serve(*host_and_port(listen))
    except OSError as error:
        why = "address in use" if error.errno == errno.EADDRINUSE else error.strerror or error
        key = names(SidecarConfig).metrics_listen
        raise ConfigError(f"config key '{key}': cannot serve on {listen}: {why}") from None


def admin_options(config: SidecarConfig, authenticator: Authenticator | None) -> AdminOptions:
    """The admin page's part of the config (`admin_listen` is set)."""
    from ..admin import AdminOptions  # aiohttp and jinja2 load only for the admin page

    assert config.admin_listen is not None
    host, port = host_and_port(config.admin_listen)
    return AdminOptions(
        host=host,
        port=port,
        authenticator=authenticator,
        tls=_admin_tls(config),
        allow_remote=config.admin_allow_remote,
        request_timeout_s=config.handshake_timeout_s,
    )


def _admin_tls(config: SidecarConfig) -> ssl.SSLContext | None:
    """The sidecar's certificate, when it serves TLS (browsers bring no client certificate)."""
    security = config.security
    if not security.tls_cert_file or not security.tls_key_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(security.tls_cert_file, security.tls_key_file)
    return context


async def _serve_admin(
    state: ServerState, config: SidecarConfig, address: str, authenticator: Authenticator | None
) -> AdminServer:
    from ..admin import start_admin  # aiohttp and jinja2 load only for the admin page

    try:
        return await start_admin(state, admin_options(config, authenticator), address)
    except OSError as error:
        why = "address in use" if error.errno == errno.EADDRINUSE else error.strerror or error
        raise ConfigError(
            f"config key '{names(SidecarConfig).admin_listen}': cannot serve on"
            f" {config.admin_listen}: {why}"
        ) from None


def raise_open_files() -> None:
    """Raise the open-file soft limit to the hard one: every connection is a file, and
    at the soft limit (often 1024) new agents could not connect. Logs both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:
            _log.warning("open files: cannot raise the soft limit %d to %d: %s", soft, hard, error)
            return
    now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    _log.info("open files: soft limit %d (was %d), hard limit %d", now, soft, hard)


def server_options(config: SidecarConfig) -> list[tuple[str, int]]:
    """Message size, exclusive ports, the keepalive that detects dead peers in time, the
    connection bounds (how many at once, how long one may take to say HTTP/2), and what
    gRPC keeps per connection: each client's session comes on a connection of its own."""
    half = max(1, int(config.dead_peer_timeout_s * 500))  # ms: ping, then wait as long
    size = config.state.limits.max_message_bytes
    return [
        ("grpc.max_allowed_incoming_connections", config.state.limits.max_connections),
        # gRPC closes a connection whose preface and SETTINGS (after TLS) come later
        ("grpc.server_handshake_timeout_ms", max(1, int(config.handshake_timeout_s * 1000))),
        ("grpc.so_reuseport", 0),  # else a second sidecar on the port splits the clients
        ("grpc.max_receive_message_length", size),
        ("grpc.max_send_message_length", size),
        ("grpc.keepalive_time_ms", half),
        ("grpc.keepalive_timeout_ms", half),
        ("grpc.http2.ping_timeout_ms", half),  # newer gRPC cores time pings out by this
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_sent_ping_interval_without_data_ms", half),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.enable_channelz", 0),  # nothing serves it: 0.6 KiB a connection (a session)
        # zerocopy sends are off, yet each connection kept records for 4 of them (0.7 KiB)
        ("grpc.experimental.tcp_tx_zerocopy_max_simultaneous_sends", 0),
    ]


def server_credentials(config: SidecarConfig) -> grpc.ServerCredentials | None:
    security = config.security  # checked by the config: both files, or neither
    if not security.tls_cert_file or not security.tls_key_file:
        return None
    key = Path(security.tls_key_file).read_bytes()
    cert = Path(security.tls_cert_file).read_bytes()
    client_ca = (
        Path(security.tls_client_ca_file).read_bytes() if security.tls_client_ca_file else None
    )
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def reflection_enabled(config: SidecarConfig, listen: str) -> bool:
    """As configured; by default only where no one but this host can reach it."""
    if config.reflection is not None:
        return config.reflection
    host = listen.rpartition(":")[0].strip("[]")
    return listen.startswith("unix:") or host in ("127.0.0.1", "localhost", "::1")


def bound_address(listen: str, port: int) -> str:
    """The address actually bound: `listen` with port 0 replaced."""
    if listen.startswith("unix:"):
        return listen
    host, _, _ = listen.rpartition(":")
    return f"{host}:{port}"
