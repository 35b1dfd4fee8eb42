"""One call per reported assembly: the report against the key's last one, kept in its history.

The caller asks once (`Reporter.report`) and gets the report with what the metrics follow
(`Reported`): which parts broke the prefix, how much of it stayed, and which keys and
breakers the bounded history let go of. Usage the model server read attaches to the key's
latest report (`Reporter.observe`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from dsh_system_prompt_core import Reason

from ..registry import Assembly, ServiceError, Status
from .history import HistoryEntry, HistoryKey, Remembered, ReportHistory
from .report import build_report
from .tokens import Tokenizer
from .tool_order import Freeze, frozen_change, previous_tools, stable_order, tool_prints
from .values import Layout, Report


@dataclass(frozen=True, slots=True)
class Reported:
    """One assembly reported under `key`: its report, what remembering it did, and the
    assembly as reported (its tools stably ordered when asked)."""

    key: HistoryKey
    report: Report
    remembered: Remembered
    assembly: Assembly

    @property
    def breaker(self) -> str:
        """The first changed part when the report broke the key's prefix, else ""."""
        return self.report.stability.seen.first_changed if self.remembered.entry.broke else ""

    @property
    def stable_share(self) -> float | None:
        """The share of a scope's prefix unchanged since its last report; None for a
        caller-named key, a first report or an empty prefix."""
        return None if self.key.kind != "scope" else self.report.stability.seen.stable_share


class Reporter:
    """Reports assemblies against the history of their key, measured by `tokenizer`."""

    def __init__(self, history: ReportHistory, tokenizer: Tokenizer | None) -> None:
        self.history = history
        self.tokenizer = tokenizer

    def report(
        self,
        key: HistoryKey,
        assembly: Assembly,
        layout: Layout,
        revision: int,
        stable: Collection[str] | None = None,
        freeze: Freeze = Freeze.NONE,
    ) -> Reported:
        """Report `assembly` (tracked, of `revision`) against the key's last report, and keep it.

        With `stable` (the names `tool_order` places), the tools it does not place are first
        put in the order of the key's last report (`tool_order.stable_order`), and the report
        says how that differs from the order sorting gave. `freeze` holds or releases the
        key's tools (`tool_order.Freeze`); while they are held, an assembly whose tools differ
        from the last report's is refused TOOLS_FROZEN and not kept.
        """
        if freeze is Freeze.RELEASE:
            self.history.release(key)
        previous, evicted = self.history.previous(key)
        ordering = None
        if stable is not None:
            tools, ordering = stable_order(assembly.tools, stable, previous_tools(previous))
            assembly = replace(assembly, tools=tools)  # the assembled one may be shared
        report, current = build_report(assembly, self.tokenizer, layout, previous, evicted)
        report = replace(report, tool_order=ordering)
        since = self.history.frozen_since(key)
        if since is not None and (
            change := frozen_change(tool_prints(previous), tool_prints(current))
        ):
            raise ServiceError(
                Status.FAILED_PRECONDITION,
                Reason.TOOLS_FROZEN,
                f"the tools of {key.describe()} are frozen since its report {since}: {change}"
                " (release them with tool_freeze RELEASE to change them)",
            )
        remembered = self.history.remember(key, report, current, revision)
        if freeze is Freeze.HOLD and since is None:
            self.history.freeze(key, remembered.entry.sequence)
        return Reported(key=key, report=report, remembered=remembered, assembly=assembly)

    def observe(self, key: HistoryKey, cached: int, prompt: int | None) -> HistoryEntry:
        """Attach the model server's usage to the key's latest report; REPORT_NOT_FOUND
        when the key has none."""
        entry = self.history.observe(key, cached, prompt)
        if entry is None:
            raise ServiceError(
                Status.NOT_FOUND,
                Reason.REPORT_NOT_FOUND,
                f"no reported assembly for {key.describe()} to attach usage to"
                " (assemble with report=True first)",
            )
        return entry
