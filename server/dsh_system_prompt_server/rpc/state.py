"""What the sidecar serves from, built once: both faces (the servicer, the admin page) take it.

The servicer acts on it, the admin page only reads it; neither builds any of it. The
sidecar makes it from its config (`StateSettings`) and a reload reconfigures it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..guard import Gate, Shares
from ..registry import Failure, Kind, Registration, Registry
from ..reports import Reporter, ReportHistory, load_tokenizer
from ..telemetry import Metrics, logger, step_spans
from .assemble import Assembler
from .settings import ServerLimits, StateSettings
from .streams import Listeners, OutboxLimits, Sessions, Watches, WatchSettings

if TYPE_CHECKING:
    from ..telemetry import Tracing

_log = logger("state")


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
        *,
        dead_peer_s: float,
    ) -> None:
        limits, reports = settings.limits, settings.reports
        self.registry = registry
        self.metrics = metrics
        registry.ejector.step_spans = step_spans(tracing)  # a span per rule run, when tracing
        outbox = self._outbox(limits)
        self.sessions = Sessions(
            registry, metrics, limits.max_sessions, limits.max_sessions_per_peer, outbox, tracing
        )
        self.sessions.max_message_bytes = limits.max_message_bytes  # what clients are told
        # a listener whose stream the sidecar closed keeps its place as long as its owner
        # may take to be found dead
        self.listeners = Listeners(
            registry, self.sessions, metrics, outbox, tracing, away_s=dead_peer_s
        )
        self.tokenizer = load_tokenizer(reports.tokenizer)
        self.reports = ReportHistory(
            depth=reports.report_history,
            max_keys=reports.report_keys,
            max_bytes=limits.max_report_history_bytes,
        )
        self.reporter = Reporter(self.reports, self.tokenizer)
        self.assembler = Assembler(
            registry,
            self.reporter,
            metrics,
            limits.max_message_bytes,
            limits.max_response_cache_bytes,
        )
        self.shares = Shares(settings.fair_share)  # each client's share of the event loop
        self.shares.on_wait = metrics.share_waits.inc
        self.watches = Watches(
            registry,
            _watch_settings(settings),
            self.sessions.client_name,
            self.tokenizer,
            metrics,
            self.shares,
        )
        self.gate = Gate()
        self.prefix_layout = reports.prefix_layout
        registry.ejector.on_eject = self._ejected
        registry.ejector.on_rule = metrics.rule_ran  # each rule's runs, by outcome
        registry.ejector.on_gone = metrics.rule_gone
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
        """Take the reloaded live settings (the registry's first): quotas, the watch buffer,
        the report layout, and the outbox of streams opened from now on."""
        limits = settings.limits
        self.sessions.set_limits(limits.max_sessions, limits.max_sessions_per_peer)
        self.sessions.outbox_limits = self.listeners.outbox_limits = self._outbox(limits)
        self.prefix_layout = settings.reports.prefix_layout
        self.watches.reconfigure(_watch_settings(settings))
        self.assembler.responses.max_bytes = limits.max_response_cache_bytes
        self.assembler.parts.max_bytes = limits.max_response_cache_bytes
        self.reports.max_bytes = limits.max_report_history_bytes
        self.shares.reconfigure(settings.fair_share)

    def _outbox(self, limits: ServerLimits) -> OutboxLimits:
        """A session's or listener's outbox: its bound, and the registry's answer time for
        one write."""
        return OutboxLimits(limits.max_outbox_bytes, self.registry.settings.provider_timeout_s)


def _watch_settings(settings: StateSettings) -> WatchSettings:
    """The watches' settings: the streams' keys, their limits, the reports' layout."""
    streams, limits = settings.streams, settings.limits
    return WatchSettings(
        watch_buffer=streams.watch_buffer,
        watch_lag_s=streams.watch_lag_s,
        max_watchers=limits.max_watchers,
        max_watchers_per_peer=limits.max_watchers_per_peer,
        prompt_coalesce_s=streams.prompt_coalesce_s,
        watch_coalesce_s=streams.watch_coalesce_s,
        prefix_layout=settings.reports.prefix_layout,
        prompt_bytes=4 * limits.max_outbox_bytes,  # every client's prompts in flight together
        prompt_bytes_per_s=streams.prompt_bytes_per_s,
    )
