"""The admin page's live prompt: a scope's prompt of static parts as it changes, as the page
shows it (its parts coloured by origin, what changed, the cache verdict of the change).

The page looks, it never calls a client: the prompt is `reports/live_prompt.py`'s, as
WatchPrompt's is, assembled in process for the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dsh_system_prompt_core import RenderFailure, interpolate

from ..registry import (
    PartKey,
    PartKind,
    RegistryError,
    StepRegistration,
    runs_everywhere,
    unnamed_step,
)
from ..reports import LivePrompt, PartPrint, Previous, Size, Stability, shown_origin, shown_reason
from ..rpc import ServerState
from .views import GLOBAL_LABEL, Names, listener_name, origin_class, size_text


@dataclass(frozen=True)
class PromptPart:
    kind: str  # section, tool or context
    name: str
    origin: str  # the colour: builtin, global, scope, ancestor, listener
    source: str  # where it came from, in words
    text: str  # as the model reads it (a tool: its JSON)
    size: str
    dynamic: bool
    change: str  # since the previous prompt this page saw: "", "new", "changed", "recomputed"


@dataclass(frozen=True)
class Verdict:
    """What the last change did to the prompt-cache prefix."""

    broke: bool
    first_changed: str
    reason: str
    stable: str
    recomputed: str
    diff: str


@dataclass(frozen=True)
class PromptView:
    scope: str | None
    label: str
    chain: list[str]
    opened: bool  # a handle is open on the scope (else it assembles as the global scope)
    revision: int
    layout: str
    tokenizer: str
    listeners: list[str]  # run by a real assembly, never by the page
    parts: list[PromptPart] = field(default_factory=list)  # the prefix in layout order, then
    # the runtime context
    totals: list[tuple[str, str]] = field(default_factory=list)
    verdict: Verdict | None = None  # None for the first prompt this page saw
    error: str = ""


class PromptWatcher:
    """The prompt of one scope as it changes, each compared with the one before."""

    def __init__(self, state: ServerState, scope: str | None, names: Names | None = None) -> None:
        self._state = state
        self._scope = scope
        self._names = names  # the layers whose steps it names (None: every layer's)
        self._live = LivePrompt(state.registry, scope, state.tokenizer)
        self._view: PromptView | None = None

    def version(self) -> int:
        return self._state.registry.revision

    async def view(self) -> PromptView:
        """The prompt now; the same view again while nothing changed."""
        if self._view is not None and self._view.revision == self.version():
            return self._view
        self._view = await self._build()
        return self._view

    def _step(self, entry: StepRegistration) -> str:
        """A step of the plan as the viewer is shown it: by its layer alone when held in one
        its credential does not name."""
        if self._names is None or self._names(entry.scope):
            return listener_name(entry)
        return unnamed_step(entry.kind.value, entry.scope, runs_everywhere(entry))

    async def _build(self) -> PromptView:
        state, scope = self._state, self._scope
        registry = state.registry
        view = PromptView(
            scope=scope,
            label=scope if scope is not None else GLOBAL_LABEL,
            chain=registry.scope_chain(scope),
            opened=scope is None or scope in registry.scope_keys(),
            revision=registry.revision,
            layout=state.prefix_layout.value,
            tokenizer=state.tokenizer.name if state.tokenizer else "",
            listeners=[self._step(e) for e in registry.plan(scope).listeners],
        )
        try:
            prompt = await self._live.next(state.prefix_layout)
        except RegistryError as error:
            return replace(view, error=error.message)
        report = prompt.report
        names = self._names
        verdict = None if prompt.before is None else _verdict(report.stability, names)
        before = _fingerprints(prompt.before)
        variables = prompt.assembly.variables
        parts = [
            _prompt_part(part, prompt.laid_out, variables, prompt.placeholders, names)
            for part, _ in report.parts
        ]
        if before is not None:
            stable = {part.key for part, kept in report.parts if kept}
            parts = [
                replace(shown, change=_change(part, stable, before))
                for shown, (part, _) in zip(parts, report.parts, strict=True)
            ]
        totals = [
            ("system prompt", size_text(report.prompt)),
            ("tools", size_text(report.tools)),
            ("runtime context", size_text(report.context_snapshot)),
            ("prefix (tools and system prompt)", size_text(report.stability.seen.prefix)),
        ]
        return replace(
            view,
            revision=prompt.revision,
            parts=parts,
            totals=totals,
            verdict=verdict,
            error=report.render_error,
        )


def _fingerprints(previous: Previous | None) -> dict[PartKey, str] | None:
    """Each part's fingerprint in the previous prompt (None before the first)."""
    if previous is None:
        return None
    prints = {part.key: part.fingerprint for part in previous.parts}
    prints.update({(PartKind.CONTEXT, name): print_ for name, print_ in previous.contexts.items()})
    return prints


def _change(part: PartPrint, stable: set[PartKey], before: dict[PartKey, str]) -> str:
    """What happened to a part since the previous prompt; "recomputed": the same text,
    after the first change of the prefix, so the model server computes it again."""
    if part.key not in before:
        return "new"
    if before[part.key] != part.fingerprint:
        return "changed"
    return "" if part.key in stable or part.kind is PartKind.CONTEXT else "recomputed"


def _prompt_part(
    part: PartPrint,
    laid_out: Previous,
    variables: dict[str, str | None],
    placeholders: frozenset[PartKey],
    names: Names | None,
) -> PromptPart:
    if part.kind is PartKind.CONTEXT:
        try:
            text = interpolate(part.raw, variables, f'context "{part.name}"')
        except RenderFailure:
            text = part.raw
    else:
        text = laid_out.text[part.start : part.end]
    return PromptPart(
        kind=part.kind,
        name=part.name,
        origin=origin_class(part.origin),
        source=shown_origin(part.origin, names).describe(),
        text=text,
        size=size_text(Size(part.bytes, part.tokens)),
        dynamic=part.key in placeholders,
        change="",
    )


def _verdict(stability: Stability, names: Names | None) -> Verdict:
    return Verdict(
        broke=bool(stability.seen.reason),
        first_changed=stability.seen.first_changed,
        reason=shown_reason(stability.seen.reason, stability.seen.steps, names),
        stable=size_text(Size(stability.seen.stable_bytes, stability.seen.stable_tokens)),
        recomputed=size_text(stability.seen.recomputed),
        diff=stability.diff,
    )
