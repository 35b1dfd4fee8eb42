"""The sidecar's metrics: their families, names, help texts and labels, counted in process
(`counts.py`). `Metrics.registry`, the Prometheus registry over them, is built on first use
(`exposition.py`, the only module that imports prometheus_client): by `metrics_listen`, or
by whoever reads it, so a sidecar that serves no /metrics never loads the library.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from dsh_system_prompt_core import Reason

from ..registry import CALLBACK_FAILURES, AnyRegistration, RuleRegistration
from ..reports import HistoryEntry, HistoryKey, Reported
from .counts import Family, Level, Reading, Timings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


RULE_OUTCOMES = ("ok", "skipped", "failed")


class Metrics:
    """The sidecar's metrics; gauges read live counts when scraped."""

    def __init__(self, key_labels: bool = False) -> None:
        # /metrics has no auth: scope keys and report keys label series only if asked.
        self._key_labels = key_labels
        self.assemble_seconds = Timings(
            "dsp_assemble_seconds",
            "Time the sidecar spends on one Assemble call",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1, 5),
        )
        self.assembly_failures = Family(
            "dsp_assembly_failures",
            "Assemblies failed, by ErrorInfo reason",
            ["reason"],
        )
        self.ejected_callbacks = Family(
            "dsp_ejected_callbacks",
            "Providers and listeners ejected for not answering in time, by kind",
            ["kind"],
        )
        self.skipped_callbacks = Family(
            "dsp_skipped_callbacks",
            "Steps assemblies went on without (callbacks and rules under failure_policy IGNORE"
            " that failed), by kind (provider, listener, rule) and ErrorInfo reason",
            ["kind", "reason"],
        )
        self.rule_evaluations = Family(
            "dsp_rule_evaluations",
            'Rules run by assemblies, by rule, its scope ("global" for none) and outcome:'
            " ok, skipped (failed under failure_policy IGNORE), failed (failed its assembly)",
            ["rule", "scope", "outcome"],
        )
        # (rule, scope) labels -> the ids of the live rules counted under them: a series goes
        # when its last rule is disposed, so a churn of rule names leaves none behind.
        self._rules: dict[tuple[str, str], set[str]] = {}
        self.share_waits = Family(
            "dsp_share_waits",
            "Calls and watch writes made to wait for their client's fair share of the event"
            " loop ([fair_share])",
        )
        self.refused_calls = Family(
            "dsp_refused_calls",
            "Calls refused for their credential, by ErrorInfo reason (UNAUTHENTICATED: none or"
            " a wrong one; PERMISSION_DENIED: the policy)",
            ["reason"],
        )
        self.stalled_peers = Family(
            "dsp_stalled_peers",
            "Sessions, listeners and watchers closed for not reading their stream, by kind",
            ["kind"],
        )
        self.sessions = Reading("dsp_sessions", "Open sessions")
        self.registrations = Reading("dsp_registrations", "Live registrations (built-ins included)")
        self.watchers = Reading("dsp_watchers", "Change-event subscribers")
        self.prefix_stable_ratio = Level(
            "dsp_prefix_stable_ratio",
            "Share of the prompt prefix (tools, system prompt) unchanged at the last report",
            ["scope"],
        )

        key = ["key_kind", "key"]
        self.cache_reports = Family("dsp_cache_reports", "Reported assemblies, by history key", key)
        self.cache_breaks = Family(
            "dsp_cache_breaks",
            "Reported assemblies that broke the prompt prefix, by key and first changed part",
            [*key, "part"],
        )
        self.cache_recomputed = Family(
            "dsp_cache_recomputed",
            "Prefix recomputed because of breaks, in tokens (with a tokenizer) or bytes",
            [*key, "unit"],
        )
        self.cache_observed_ratio = Level(
            "dsp_cache_observed_ratio",
            "Cached tokens the model server reported / the stable prefix tokens predicted,"
            " at the key's last reported usage",
            key,
        )

    def assembly_failed(self, reason: Reason) -> None:
        """Count one failed assembly, if its reason is one of those counted."""
        if reason in CALLBACK_FAILURES:
            self.assembly_failures.labels(reason).inc()

    def reported(self, reported: Reported) -> None:
        """Follow one report: its counts, its scope's stable share, what its history forgot."""
        labels = reported.key.labels()
        for forgotten, breakers in reported.remembered.forgotten_keys:
            self.forget_key(forgotten.labels(), breakers)
        for part in reported.remembered.forgotten_breakers:
            self.forget_breaker(labels, part)
        recomputed = reported.report.stability.seen.recomputed
        self.cache_reported(labels, recomputed.tokens, recomputed.bytes, reported.breaker)
        if (share := reported.stable_share) is not None:
            self.prefix_stable(reported.key.name, share)

    def usage_observed(self, key: HistoryKey, entry: HistoryEntry) -> None:
        """Follow the model server's usage of the key's latest report."""
        if entry.seen.stable_tokens and entry.observed_cached_tokens is not None:
            self.cache_observed(
                key.labels(), entry.observed_cached_tokens / entry.seen.stable_tokens
            )

    def rule_ran(self, entry: AnyRegistration, outcome: str) -> None:
        """Count one run of a rule, by `outcome` ("ok", "skipped", "failed")."""
        if entry.disposed:  # disposed while it ran: its series are gone and stay gone
            return
        labels = self._rule_labels(entry)
        series = self.rule_evaluations.values
        counted = (*labels, outcome)
        if counted in series and entry.id in self._rules.get(labels, ()):  # counted before
            series[counted] += 1
            return
        self._rules.setdefault(labels, set()).add(entry.id)
        self.rule_evaluations.labels(*counted).inc()

    def rule_gone(self, entry: AnyRegistration) -> None:
        """Drop a disposed rule's series (unless another live rule shares its labels)."""
        labels = self._rule_labels(entry)
        ids = self._rules.get(labels)
        if ids is None or entry.id not in ids:
            return
        ids.discard(entry.id)
        if ids:
            return
        del self._rules[labels]
        for outcome in RULE_OUTCOMES:
            with contextlib.suppress(KeyError):
                self.rule_evaluations.remove(*labels, outcome)

    def _rule_labels(self, entry: AnyRegistration) -> tuple[str, str]:
        """A rule's (rule, scope) labels: its scope key (or an operator rule's pattern) only
        when key labels are on, "" otherwise; "global" for a rule of no scope."""
        scope = entry.scope or (entry.pattern if isinstance(entry, RuleRegistration) else None)
        if scope is None:
            return entry.name, "global"
        return entry.name, scope if self._key_labels else ""

    def peer_stalled(self, kind: str) -> None:
        """Count one session or listener closed for not reading its stream."""
        self.stalled_peers.labels(kind).inc()

    def prefix_stable(self, scope: str | None, ratio: float) -> None:
        self.prefix_stable_ratio.labels(scope or "" if self._key_labels else "").set(ratio)

    def _key(self, key: tuple[str, str]) -> tuple[str, str]:
        """The labels of a history key: (key_kind, "") unless key labels are on."""
        return key if self._key_labels else (key[0], "")

    def cache_reported(
        self, key: tuple[str, str], tokens: int | None, recomputed: int, breaker: str
    ) -> None:
        """Count one report under `key` (key_kind, key); `breaker` is "" when nothing broke."""
        key = self._key(key)
        self.cache_reports.labels(*key).inc()
        if breaker:
            self.cache_breaks.labels(*key, breaker).inc()
        unit = "bytes" if tokens is None else "tokens"
        self.cache_recomputed.labels(*key, unit).inc(recomputed if tokens is None else tokens)

    def cache_observed(self, key: tuple[str, str], ratio: float) -> None:
        self.cache_observed_ratio.labels(*self._key(key)).set(ratio)

    def forget_breaker(self, key: tuple[str, str], part: str) -> None:
        """Drop one part's series of a key (it left the key's bounded breaker counts)."""
        if not self._key_labels:
            return  # the series is shared by every key of its kind
        with contextlib.suppress(KeyError):
            self.cache_breaks.remove(*key, part)

    def forget_key(self, key: tuple[str, str], breakers: list[str]) -> None:
        """Drop a history key's series (its history was evicted)."""
        if not self._key_labels:
            return  # the series are shared by every key of its kind
        if key[0] == "scope":
            with contextlib.suppress(KeyError):
                self.prefix_stable_ratio.remove(key[1])
        for metric, labels in (
            (self.cache_reports, [key]),
            (self.cache_recomputed, [(*key, "tokens"), (*key, "bytes")]),
            (self.cache_observed_ratio, [key]),
            (self.cache_breaks, [(*key, part) for part in breakers]),
        ):
            for label in labels:
                with contextlib.suppress(KeyError):
                    metric.remove(*label)

    def track(
        self,
        sessions: Callable[[], int],
        registrations: Callable[[], int],
        watchers: Callable[[], int],
    ) -> None:
        """Read these counts at every scrape."""
        self.sessions.set_function(sessions)
        self.registrations.set_function(registrations)
        self.watchers.set_function(watchers)

    def families(self) -> tuple[Timings | Family | Reading, ...]:
        """Every family, in the order /metrics shows them."""
        return (
            self.assemble_seconds,
            self.assembly_failures,
            self.ejected_callbacks,
            self.skipped_callbacks,
            self.rule_evaluations,
            self.share_waits,
            self.refused_calls,
            self.stalled_peers,
            self.sessions,
            self.registrations,
            self.watchers,
            self.prefix_stable_ratio,
            self.cache_reports,
            self.cache_breaks,
            self.cache_recomputed,
            self.cache_observed_ratio,
        )

    @functools.cached_property
    def registry(self) -> CollectorRegistry:
        """The Prometheus registry that reads these counts (prometheus_client loads here)."""
        from .exposition import registry_of

        return registry_of(self.families)

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics on host and port in a background thread."""
        from .exposition import serve

        serve(self.registry, host, port)
