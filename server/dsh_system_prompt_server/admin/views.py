"""What the admin page shows of scopes, cache history and sessions, read from the running
sidecar: plain values, no HTML (the live prompt's view is `live_prompt.py`'s).

Nothing here changes the registry. Session and registration ids are
capabilities (whoever knows one can register or dispose as its session), so
the page names a session by its client name and owner label (as `ls` does),
never by its id.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..registry import (
    SIDECAR_OWNER,
    STEPS,
    AnyRegistration,
    ContextRegistration,
    Dynamic,
    Kind,
    ListenerRegistration,
    Origin,
    OriginKind,
    Rule,
    RuleRegistration,
    SectionRegistration,
    Skipped,
    StepRegistration,
    ToolSet,
    owner_label,
    shown_skipped,
    value_bytes,
)
from ..reports import Break, HistoryEntry, HistoryKey, KeyHistory, Size, shown_reason
from ..rpc import ServerState

GLOBAL_LABEL = "(global)"
Names = Callable[[str | None], bool]  # which layers' steps the viewer is shown by name


def origin_class(origin: Origin) -> str:
    """The colour a part gets: builtin, global, scope, ancestor or listener."""
    if origin.kind is OriginKind.SCOPE and origin.depth > 0:
        return "ancestor"
    return origin.kind.value


def size_text(size: Size) -> str:
    tokens = "" if size.tokens is None else f", {size.tokens:,} tokens"
    return f"{size.bytes:,} bytes{tokens}"


# -- scopes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RegistrationRow:
    kind: str
    name: str
    order: str
    mode: str  # "static", "dynamic", or "" for kinds without a value
    owner: str
    size: str


@dataclass
class ScopeNode:
    key: str | None
    label: str
    handles: list[str]  # the owners of its open handles
    registrations: list[RegistrationRow]
    children: list[ScopeNode] = field(default_factory=list)


@dataclass(frozen=True)
class ScopesView:
    revision: int
    roots: list[ScopeNode]  # the global scope first, then scopes without a parent
    scope_count: int
    registration_count: int


def scopes_view(
    state: ServerState,
    reaches: Callable[[str | None], bool] = lambda _: True,
    names: Names | None = None,
) -> ScopesView:
    """The scope tree, each scope with the registrations made in it: of the scopes (and
    the global layer) `reaches` says the viewer may read; a scope whose parent it may not
    read is a root. A listener or rule held in a layer `names` does not name (None: every
    layer's) is a row of its kind alone, as the viewer's listings show it."""
    registry = state.registry
    owners = owner_names(state)
    entries = [entry for entry in registry.registrations() if reaches(entry.scope)]
    by_scope: dict[str | None, list[RegistrationRow]] = {}
    handles: dict[str, list[str]] = {}
    for entry in entries:
        if entry.kind is Kind.SCOPE:
            handles.setdefault(entry.name, []).append(owners.get(entry.owner, "?"))
            continue
        if names is not None and entry.kind in STEPS and not names(entry.scope):
            row = RegistrationRow(entry.kind.value, "", "", "", "", "")
        else:
            row = _registration(entry, owners)
        by_scope.setdefault(entry.scope, []).append(row)
    keys = {*filter(reaches, registry.scope_keys()), *(key for key in by_scope if key is not None)}
    nodes = {key: ScopeNode(key, key, handles.get(key, []), by_scope.get(key, [])) for key in keys}
    roots: list[ScopeNode] = [ScopeNode(None, GLOBAL_LABEL, [], by_scope.get(None, []))]
    for key in sorted(keys):
        chain = registry.scope_chain(key)
        parent = chain[1] if len(chain) > 1 else None
        if parent is not None and parent in nodes:
            nodes[parent].children.append(nodes[key])
        else:
            roots.append(nodes[key])
    return ScopesView(registry.revision, roots, len(keys), len(entries))


def owner_names(state: ServerState) -> dict[str, str]:
    """Session id -> how the page names it: client name and tag."""
    names = {SIDECAR_OWNER: "sidecar (built-in)"}
    for session in state.sessions.all():
        names[session.id] = f"{session.client_name or 'unnamed'} #{owner_label(session.id)}"
    return names


def _registration(entry: AnyRegistration, owners: dict[str, str]) -> RegistrationRow:
    order = ""
    if isinstance(entry, SectionRegistration | ContextRegistration):
        order = f"{entry.order:g}"
        if isinstance(entry, SectionRegistration) and entry.complete:
            order += " (complete)"
    name = entry.name
    if isinstance(entry, ListenerRegistration | RuleRegistration) and entry.global_:
        where = _step_where(entry)
        name = f"{name} ({where})" if name else f"({where})"
    return RegistrationRow(
        kind=entry.kind.value,
        name=name,
        order=order,
        mode=_mode(entry),
        owner=owners.get(entry.owner, "?"),
        size=_value_size(entry.value, entry.kind),
    )


def _mode(entry: AnyRegistration) -> str:
    if entry.kind in (Kind.LISTENER, Kind.SUPPRESSOR, Kind.SCOPE):
        return ""
    if isinstance(entry, RuleRegistration):
        return "cel"  # run by the sidecar itself: neither a static value nor a callback
    return "dynamic" if isinstance(entry.value, Dynamic) else "static"


def _value_size(value: object, kind: Kind) -> str:
    if kind is Kind.VARIABLE and not isinstance(value, Dynamic):
        # withheld: the view is shared by readers not granted values, to whom a short
        # secret's exact length would narrow the guesses
        return ""
    if isinstance(value, str):
        return f"{value_bytes(value):,} bytes"
    if isinstance(value, ToolSet):
        count = len(value.schemas)
        return f"{count} tool{'s' if count != 1 else ''}, {value_bytes(value):,} bytes"
    if isinstance(value, Dynamic):
        return "at each assembly"
    if isinstance(value, Rule):
        match, mutations = len(value.match), len(value.mutations)
        return f"{match} match, {mutations} mutation{'s' if mutations != 1 else ''}"
    return ""


# -- the cache history of a scope or report key ---------------------------------------

CHART_WIDTH = 640
CHART_HEIGHT = 140
CHART_PAD = 24


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    state: str  # "first", "stable" or "break"
    title: str


@dataclass(frozen=True)
class ReportRow:
    sequence: int
    at: str
    revision: int
    state: str
    verdict: str
    stable: str
    recomputed: str
    observed: str
    skipped: list[str]  # the steps the assembly went on without, each with why


@dataclass(frozen=True)
class CacheView:
    label: str
    found: bool
    evicted: bool
    reports: int
    breaks: int
    breakers: list[tuple[str, int]]
    recomputed: str
    recent: list[ReportRow]
    bars: list[Bar]
    chart: tuple[int, int]
    first_at: str
    last_at: str
    last_break: Break | None
    last_break_at: str
    version: int


def cache_key(scope: str | None, key: str | None) -> HistoryKey:
    """The history the page shows: a report key's, else a scope's (the global one)."""
    if key:
        return HistoryKey("key", key)
    return HistoryKey("scope", scope or None)


def cache_view(state: ServerState, key: HistoryKey, names: Names | None = None) -> CacheView:
    """The key's prefix-stability history: counts, recent reports, the last break; the
    steps held in a layer `names` does not name (None: every layer's), skipped or named in
    a reason, unnamed."""
    reports = state.reports
    kept, evicted = reports.get(key)
    history = kept or KeyHistory(None, deque())
    recent = list(history.recent)
    last = history.last_break
    if last is not None:  # its reason in the viewer's words
        last = replace(last, reason=shown_reason(last.reason, last.steps, names))
    recomputed = Size(history.recomputed_bytes, history.recomputed_tokens)
    return CacheView(
        label=key.describe(),
        found=kept is not None,
        evicted=evicted,
        reports=history.reports,
        breaks=history.breaks,
        breakers=history.top_breakers(),
        recomputed=size_text(recomputed),
        recent=[_report_row(entry, names) for entry in reversed(recent)],
        bars=_bars(recent, names),
        chart=(CHART_WIDTH, CHART_HEIGHT),
        first_at=_clock(recent[0].at) if recent else "",
        last_at=_clock(recent[-1].at) if recent else "",
        last_break=last,
        last_break_at=_clock(last.at) if last else "",
        version=reports.version,
    )


def _state(entry: HistoryEntry) -> str:
    if not entry.seen.has_previous:
        return "first"
    return "break" if entry.broke else "stable"


def _stable_share(entry: HistoryEntry) -> float:
    share = entry.seen.stable_share
    return 1.0 if share is None else share


def _report_row(entry: HistoryEntry, names: Names | None) -> ReportRow:
    state = _state(entry)
    verdict = {
        "first": "first report: nothing to compare",
        "stable": "prefix unchanged",
        "break": f"broke at {entry.seen.first_changed}: {_reason(entry, names)}",
    }[state]
    observed = ""
    if entry.observed_cached_tokens is not None:
        observed = f"{entry.observed_cached_tokens:,} tokens cached"
    return ReportRow(
        sequence=entry.sequence,
        at=_clock(entry.at),
        revision=entry.revision,
        state=state,
        verdict=verdict,
        stable=f"{_stable_share(entry):.0%}",
        recomputed=size_text(entry.seen.recomputed),
        observed=observed,
        skipped=_skipped(entry, names),
    )


def skipped_text(step: Skipped) -> str:
    """A skipped step as the page names it: which callback, its reason, its message."""
    where = "global" if step.scope is None else f'scope "{step.scope}"'
    name = f' "{step.name}"' if step.name else ""
    return f"{step.kind.value}{name} ({where}): {step.reason}: {step.message}"


def _reason(entry: HistoryEntry, names: Names | None) -> str:
    return shown_reason(entry.seen.reason, entry.seen.steps, names)


def _skipped(entry: HistoryEntry, names: Names | None) -> list[str]:
    shown = [skipped_text(step) for step in shown_skipped(entry.skipped, names)]
    if entry.skipped_count > len(shown):
        shown.append(f"and {entry.skipped_count - len(shown)} more")
    return shown


def _bars(recent: list[HistoryEntry], names: Names | None) -> list[Bar]:
    """One bar per recent report, oldest left; its height is the share of the prefix kept."""
    if not recent:
        return []
    inner_w, inner_h = CHART_WIDTH - 2 * CHART_PAD, CHART_HEIGHT - 2 * CHART_PAD
    slot = inner_w / len(recent)
    bars = []
    for index, entry in enumerate(recent):
        share = _stable_share(entry)
        height = max(2.0, inner_h * share)
        state = _state(entry)
        title = f"#{entry.sequence} at {_clock(entry.at)}: " + _report_row(entry, names).verdict
        if state == "break":
            title += f" ({size_text(entry.seen.recomputed)} recomputed)"
        if entry.skipped_count:
            title += f"; {entry.skipped_count} skipped"
        bars.append(
            Bar(
                x=round(CHART_PAD + index * slot + slot * 0.15, 1),
                y=round(CHART_PAD + inner_h - height, 1),
                width=round(slot * 0.7, 1),
                height=round(height, 1),
                state=state,
                title=title,
            )
        )
    return bars


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


# -- named for the page --------------------------------------------------------------


def listener_name(entry: StepRegistration) -> str:
    """A waterfall step (a listener, or a rule) as the page names it."""
    where = _step_where(entry)
    noun = entry.kind.value
    return f'{noun} "{entry.name}" ({where})' if entry.name else f"{noun} ({where})"


def _step_where(entry: StepRegistration) -> str:
    """Where a waterfall step runs: everywhere, in a scope (and below), or, an operator's
    rule from the config file, in the scopes its pattern matches."""
    if isinstance(entry, RuleRegistration) and entry.pattern is not None:
        return f'scopes "{entry.pattern}"'
    return "everywhere" if entry.scope is None or entry.global_ else f'scope "{entry.scope}"'


# -- sessions and health --------------------------------------------------------------


@dataclass(frozen=True)
class SessionRow:
    name: str
    peer: str
    registrations: str  # counts by kind
    listeners: list[str]
    providers: list[str]
    provide_requests: int


@dataclass(frozen=True)
class SessionsView:
    health: list[tuple[str, str]]
    failures: list[tuple[str, int]]
    sessions: list[SessionRow]
    skipped: list[tuple[str, str, int]]  # kind, reason, steps assemblies went on without


def sessions_view(state: ServerState, address: str, started: float) -> SessionsView:
    """Connected clients with what they registered, and the figures an operator checks first."""
    registry = state.registry
    rows = []
    for session in state.sessions.all():
        entries = registry.registrations(session.id)
        counts = Counter(entry.kind.value for entry in entries)
        rows.append(
            SessionRow(
                name=f"{session.client_name or 'unnamed'} #{owner_label(session.id)}",
                peer=session.peer,
                registrations=", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
                or "none",
                listeners=[  # the waterfall steps: its listeners and its rules
                    listener_name(e)
                    for e in entries
                    if isinstance(e, ListenerRegistration | RuleRegistration)
                ],
                providers=[_provider(e) for e in entries if isinstance(e.value, Dynamic)],
                provide_requests=session.provide_requests,
            )
        )
    count, total = _assemblies(state)
    mean = f"{total / count * 1000:.2f} ms" if count else "none yet"
    history = state.reports
    kept = [history.get(key)[0] for key in history.history_keys()]
    breaks = sum(k.breaks for k in kept if k is not None)
    reports = sum(k.reports for k in kept if k is not None)
    health = [
        ("status", "NOT_SERVING (draining)" if state.gate.draining else "SERVING"),
        ("address", address),
        ("uptime", _duration(time.time() - started)),
        ("revision", str(registry.revision)),
        ("sessions", str(len(state.sessions))),
        ("registrations", str(registry.registration_count())),
        ("scopes", str(len(registry.scope_keys()))),
        ("change watchers (live pages included)", str(registry.changes.subscriber_count())),
        ("assemblies", f"{count:,}"),
        ("mean assembly time", mean),
        ("cache reports (kept keys)", f"{reports:,}, {breaks:,} broke the prefix"),
        ("tokenizer", state.tokenizer.name if state.tokenizer else "none (bytes only)"),
        ("prefix layout", state.prefix_layout.value),
    ]
    return SessionsView(health, _failures(state), rows, _skipped_counts(state))


def _provider(entry: AnyRegistration) -> str:
    where = f'scope "{entry.scope}"' if entry.scope is not None else "global"
    name = f' "{entry.name}"' if entry.name else ""
    return f"{entry.kind.value}{name} ({where})"


def _assemblies(state: ServerState) -> tuple[int, float]:
    """How many Assemble calls were timed, and their total seconds."""
    timings = state.metrics.assemble_seconds
    return timings.count, timings.sum


def _failures(state: ServerState) -> list[tuple[str, int]]:
    series = state.metrics.assembly_failures.series()
    return sorted((reason, int(value)) for (reason,), value, _ in series if value)


def _skipped_counts(state: ServerState) -> list[tuple[str, str, int]]:
    series = state.metrics.skipped_callbacks.series()
    return sorted((kind, reason, int(value)) for (kind, reason), value, _ in series if value)


def _duration(seconds: float) -> str:
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}h {minute:02d}m {second:02d}s" if hours else f"{minute}m {second:02d}s"
