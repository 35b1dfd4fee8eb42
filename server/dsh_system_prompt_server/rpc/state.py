"""What the sidecar serves from, built once: both faces (the servicer, the admin page) take it.

The servicer acts on it, the admin page only reads it; neither builds any of it. The
sidecar makes it from its config (`StateSettings`) and a reload reconfigures it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..guard import Gate, Shares, ShareSettings
from ..registry import Failure, Kind, Registration, Registry
from ..reports import Layout, Reporter, ReportHistory, load_tokenizer
from ..telemetry import Metrics, Tracing, logger
from .assemble import Assembler
from .streams import Listeners, OutboxLimits, Sessions, Watches, WatchSettings

_log = logger("state")


@dataclass(frozen=True)
class StateSettings:
    """The config of the served state; a reload changes the live ones (see `reconfigure`)."""

    outbox: OutboxLimits  # of streams opened from now on (live)
    max_sessions: int  # live
    max_sessions_per_peer: int  # live
    watches: WatchSettings  # live
    prefix_layout: Layout  # the reports' default layout (live)
    max_message_bytes: int  # the largest message the sidecar sends
    tokenizer: str | None  # for token counts in reports; None: bytes only
    report_depth: int  # recent reports kept per history key
    report_keys: int  # history keys kept
    report_bytes: int  # what the report history may take in memory (live)
    response_bytes: int  # what the kept encoded responses may take (live)
    shares: ShareSettings  # when clients are held to a fair share of the loop (live)


class ServerState:
    """The registry and everything served beside it: sessions, listeners, watches, the
    report history, its tokenizer and reporter, the assembler (which keeps the encoded
    responses), the drain gate, the metrics."""

    def __init__(
        self,
        registry: Registry,
        settings: StateSettings,
        metrics: Metrics,
        tracing: Tracing | None = None,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.sessions = Sessions(
            registry,
            metrics,
            settings.max_sessions,
            settings.max_sessions_per_peer,
            settings.outbox,
            tracing,
        )
        self.listeners = Listeners(registry, self.sessions, metrics, settings.outbox, tracing)
        self.tokenizer = load_tokenizer(settings.tokenizer)
        self.reports = ReportHistory(
            depth=settings.report_depth,
            max_keys=settings.report_keys,
            max_bytes=settings.report_bytes,
        )
        self.reporter = Reporter(self.reports, self.tokenizer)
        self.assembler = Assembler(
            registry, self.reporter, metrics, settings.max_message_bytes, settings.response_bytes
        )
        self.shares = Shares(settings.shares)  # each client's share of the event loop
        self.shares.on_wait = metrics.share_waits.inc
        self.watches = Watches(
            registry,
            settings.watches,
            self.sessions.client_name,
            self.tokenizer,
            metrics,
            self.shares,
        )
        self.gate = Gate()
        self.prefix_layout = settings.prefix_layout
        registry.ejector.on_eject = self._ejected
        metrics.track(
            sessions=lambda: len(self.sessions),
            registrations=registry.registration_count,
            watchers=registry.changes.subscriber_count,
        )

    def _ejected(self, entry: Registration[Any], why: Failure) -> None:
        kind = "listener" if entry.kind is Kind.LISTENER else "provider"
        _log.warning(
            "ejected %s %s of %s: %s",
            kind,
            entry.name or "(unnamed)",
            self.sessions.client_name(entry.owner) or "a session",
            why.message,
        )
        self.metrics.ejected_callbacks.labels(kind).inc()

    def reconfigure(self, settings: StateSettings) -> None:
        """Take the reloaded live settings: quotas, the watch buffer, the report layout, and
        the outbox (its write timeout is `provider_timeout_s`) of streams opened from now on."""
        self.sessions.set_limits(settings.max_sessions, settings.max_sessions_per_peer)
        self.sessions.outbox_limits = self.listeners.outbox_limits = settings.outbox
        self.prefix_layout = settings.prefix_layout
        self.watches.reconfigure(settings.watches)
        self.assembler.responses.max_bytes = settings.response_bytes
        self.assembler.parts.max_bytes = settings.response_bytes
        self.reports.max_bytes = settings.report_bytes
        self.shares.reconfigure(settings.shares)
