"""Prompt-cache reports and histories as messages: parts, sources, sizes, stability."""

from __future__ import annotations

from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason

from ..registry import Origin, OriginKind, PartKind, ServiceError, Status, shown_skipped
from ..reports import (
    Freeze,
    HistoryEntry,
    HistoryKey,
    KeyHistory,
    Layout,
    PrefixStability,
    Report,
    Shows,
    Size,
    ToolOrdering,
    shown_origin,
    shown_reason,
)
from .convert import change_kind_to_proto, skipped_to_proto

_SOURCE_KINDS = {
    OriginKind.BUILTIN: pb.SOURCE_KIND_BUILTIN,
    OriginKind.GLOBAL: pb.SOURCE_KIND_GLOBAL,
    OriginKind.SCOPE: pb.SOURCE_KIND_SCOPE,
    OriginKind.LISTENER: pb.SOURCE_KIND_LISTENER,
    OriginKind.RULE: pb.SOURCE_KIND_RULE,
}
_PART_KINDS = {
    PartKind.TOOL: pb.PART_KIND_TOOL,
    PartKind.SECTION: pb.PART_KIND_SECTION,
    PartKind.CONTEXT: pb.PART_KIND_CONTEXT,
}


def report_to_proto(report: Report, key: HistoryKey, shows: Shows) -> pb.AssemblyReport:
    """`report` as a caller shown the steps of the layers `shows` names sees it."""
    stability = report.stability
    return pb.AssemblyReport(
        tokenizer=report.tokenizer,
        parts=[
            pb.PartReport(
                kind=_PART_KINDS[part.kind],
                name=part.name,
                source=source_to_proto(shown_origin(part.origin, shows)),
                bytes=part.bytes,
                tokens=part.tokens,
                fingerprint=part.fingerprint,
                stable=stable,
            )
            for part, stable in report.parts
        ],
        tools=size_to_proto(report.tools),
        prompt=size_to_proto(report.prompt),
        context_snapshot=size_to_proto(report.context_snapshot),
        stability=pb.PrefixStability(
            **_prefix_fields(stability.seen, shows),
            messages_recomputed=stability.messages_recomputed,
            diff=stability.diff,
            previous_evicted=stability.previous_evicted,
        ),
        variables=[
            pb.VariableReport(name=name, source=source_to_proto(shown_origin(origin, shows)))
            for name, origin in report.variables
        ],
        render_error=report.render_error,
        tool_order=_tool_order(report.tool_order),
        prefix_layout=_LAYOUTS[report.layout],
        history_key=key.describe(),
        skipped=[skipped_to_proto(step) for step in shown_skipped(report.skipped, shows)],
    )


_LAYOUTS = {
    Layout.TOOLS_FIRST: pb.PREFIX_LAYOUT_TOOLS_FIRST,
    Layout.SYSTEM_FIRST: pb.PREFIX_LAYOUT_SYSTEM_FIRST,
}


def layout_from_proto(value: int, default: Layout) -> Layout:
    """The requested prefix layout; unspecified (or unknown to this sidecar) is `default`."""
    return next((layout for layout, wire in _LAYOUTS.items() if wire == value), default)


def _prefix_fields(seen: PrefixStability, shows: Shows) -> dict[str, Any]:
    """What a report's stability and a history entry both say of the prefix, named as both
    messages (PrefixStability, CacheHistoryEntry) name it; the reason in `shows`' words."""
    return {
        "has_previous": seen.has_previous,
        "stable_bytes": seen.stable_bytes,
        "stable_tokens": seen.stable_tokens,
        "prefix": size_to_proto(seen.prefix),
        "first_changed": seen.first_changed,
        "reason": shown_reason(seen.reason, seen.steps, shows),
        "recomputed": size_to_proto(seen.recomputed),
    }


def history_key_from_proto(scope: str, report_key: str) -> HistoryKey:
    """The caller's report_key when it names one, else the scope."""
    if report_key:
        return HistoryKey(kind="key", name=report_key)
    return HistoryKey(kind="scope", name=scope or None)


def history_entry_to_proto(entry: HistoryEntry, shows: Shows) -> pb.CacheHistoryEntry:
    """A kept report as a caller shown the steps of the layers `shows` names sees it."""
    return pb.CacheHistoryEntry(
        sequence=entry.sequence,
        revision=entry.revision,
        prefix_layout=_LAYOUTS[entry.layout],
        **_prefix_fields(entry.seen, shows),
        observed_cached_tokens=entry.observed_cached_tokens,
        observed_prompt_tokens=entry.observed_prompt_tokens,
        skipped_counts=[
            pb.SkippedCount(
                kind=change_kind_to_proto(counted.kind), reason=counted.reason, count=counted.count
            )
            for counted in entry.skipped_counts
        ],
    )


def history_to_proto(
    key: HistoryKey, kept: KeyHistory | None, evicted: bool, shows: Shows
) -> pb.CacheHistory:
    """A key's history as `shows` names its steps; an unknown key has an empty one."""
    if kept is None:
        return pb.CacheHistory(key=key.describe(), recomputed=pb.Size(), evicted=evicted)
    return pb.CacheHistory(
        key=key.describe(),
        reports=kept.reports,
        breaks=kept.breaks,
        breakers=[pb.PartBreaks(part=part, count=count) for part, count in kept.top_breakers()],
        recomputed=pb.Size(bytes=kept.recomputed_bytes, tokens=kept.recomputed_tokens),
        recent=[history_entry_to_proto(entry, shows) for entry in kept.recent],
    )


def source_to_proto(origin: Origin) -> pb.Source:
    return pb.Source(
        kind=_SOURCE_KINDS[origin.kind],
        scope=origin.scope or "",
        ancestor_depth=origin.depth,
        listener=origin.listener if origin.kind is OriginKind.LISTENER else "",
        rule=origin.listener if origin.kind is OriginKind.RULE else "",
        description=origin.describe(),
    )


def size_to_proto(size: Size) -> pb.Size:
    return pb.Size(bytes=size.bytes, tokens=size.tokens)


def _tool_order(ordering: ToolOrdering | None) -> pb.ToolOrderReport | None:
    if ordering is None:  # the default sorted order: the field stays unset
        return None
    return pb.ToolOrderReport(
        kept=ordering.kept,
        position=ordering.position,
        sorted_tool=ordering.sorted_tool,
        kept_tool=ordering.kept_tool,
    )


_FREEZES: dict[int, Freeze] = {
    pb.TOOL_FREEZE_UNSPECIFIED: Freeze.NONE,
    pb.TOOL_FREEZE_HOLD: Freeze.HOLD,
    pb.TOOL_FREEZE_RELEASE: Freeze.RELEASE,
}


def freeze_from_proto(value: int, report: bool) -> Freeze:
    """The request's tool freeze: INVALID_VALUE for one this sidecar does not know, or one
    asked for without a report (the freeze belongs to the report key's history)."""
    freeze = _FREEZES.get(value)
    if freeze is None:
        raise ServiceError(
            Status.INVALID_ARGUMENT, Reason.INVALID_VALUE, f"unknown tool_freeze value {value}"
        )
    if freeze is not Freeze.NONE and not report:
        raise ServiceError(
            Status.INVALID_ARGUMENT,
            Reason.INVALID_VALUE,
            "tool_freeze needs report = true: the freeze belongs to the report key's history",
        )
    return freeze
