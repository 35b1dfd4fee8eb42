"""Prompt-cache awareness: provenance, sizes and prefix stability of an assembly.

Model servers cache the longest byte-identical prefix of a request: tools,
then the system prompt. For each reported assembly this module fingerprints
every rendered part in that order, compares them with the previous reported
assembly of the same scope, and says which part broke the prefix and why.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from dsh_system_prompt_core import (
    CONTEXT_SNAPSHOT_HEADER,
    SECTION_SEPARATOR,
    RenderFailure,
    interpolate,
    references,
)

from .registry import Assembly, Origin, OriginKind, Part, Tool
from .tokens import Tokenizer

SEPARATOR_BYTES = len(SECTION_SEPARATOR.encode())


@dataclass(frozen=True, slots=True)
class PartPrint:
    """One rendered part: what it is, where it came from, its size and fingerprint."""

    kind: str  # "tool", "section" or "context"
    name: str
    origin: Origin
    bytes: int
    tokens: int | None
    fingerprint: str
    raw: str  # a section's text before interpolation; a tool's description
    parameters: str  # a tool's parameters JSON
    variables: tuple[tuple[str, str | None], ...]  # what a section referenced, and the values

    @property
    def key(self) -> tuple[str, str]:
        return (self.kind, self.name)


@dataclass(frozen=True, slots=True)
class Size:
    bytes: int
    tokens: int | None


@dataclass(frozen=True, slots=True)
class Stability:
    has_previous: bool
    stable_bytes: int
    stable_tokens: int | None
    prefix: Size
    first_changed: str
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    tokenizer: str
    parts: list[tuple[PartPrint, bool]]  # each part and whether it is stable
    tools: Size
    prompt: Size
    context_snapshot: Size
    stability: Stability
    variables: list[tuple[str, Origin]]
    render_error: str = ""  # the first render failure, naming its part; "" when it rendered


@dataclass
class ReportHistory:
    """The last reported assemblies per scope: `depth` each, for `max_scopes` scopes."""

    depth: int = 8
    max_scopes: int = 1024
    _by_scope: OrderedDict[str | None, deque[list[PartPrint]]] = field(default_factory=OrderedDict)

    def previous(self, scope: str | None) -> list[PartPrint] | None:
        kept = self._by_scope.get(scope)
        return kept[-1] if kept else None

    def remember(self, scope: str | None, parts: list[PartPrint]) -> list[str | None]:
        """Keep `parts` for `scope`; returns the scopes forgotten to make room."""
        kept = self._by_scope.setdefault(scope, deque(maxlen=self.depth))
        kept.append(parts)
        self._by_scope.move_to_end(scope)
        forgotten = []
        while len(self._by_scope) > self.max_scopes:
            forgotten.append(self._by_scope.popitem(last=False)[0])
        return forgotten


def build_report(
    assembly: Assembly, tokenizer: Tokenizer | None, previous: list[PartPrint] | None
) -> Report:
    """Report on `assembly` (tracked with origins), against `previous` prefix parts."""
    origins = assembly.origins or {}
    failures: list[str] = []
    sections = _rendered("section", assembly.sections, assembly.variables, failures)
    contexts_text = _rendered("context", assembly.contexts, assembly.variables, failures)
    parts = [
        *(_tool_print(tool, origins, tokenizer) for tool in assembly.tools),
        *_text_prints("section", sections, assembly.variables, origins, tokenizer),
        *_text_prints("context", contexts_text, assembly.variables, origins, tokenizer),
    ]
    prefix = [part for part in parts if part.kind != "context"]
    stability, stable_count = _stability(prefix, previous, tokenizer is not None)
    stable = [index < stable_count for index in range(len(prefix))]
    contexts = [part for part in parts if part.kind == "context"]
    return Report(
        tokenizer=tokenizer.name if tokenizer else "",
        parts=[*zip(prefix, stable, strict=True), *((part, False) for part in contexts)],
        tools=_total([p for p in prefix if p.kind == "tool"], 0),
        prompt=_total([p for p in prefix if p.kind == "section"], SEPARATOR_BYTES),
        context_snapshot=_snapshot_size(contexts_text, tokenizer),
        stability=stability,
        variables=[
            (name, origins.get(("variable", name), _UNKNOWN)) for name in assembly.variables
        ],
        render_error=failures[0] if failures else "",
    )


def prefix_parts(report: Report) -> list[PartPrint]:
    """What the next report of the scope compares with."""
    return [part for part, _ in report.parts if part.kind != "context"]


_UNKNOWN = Origin(OriginKind.GLOBAL)


def _tool_print(
    tool: Tool, origins: dict[tuple[str, str], Origin], tokenizer: Tokenizer | None
) -> PartPrint:
    # The shape adapters send: name, description, then the parameters JSON as registered.
    text = (
        f'{{"name":{json.dumps(tool.name, ensure_ascii=False)},'
        f'"description":{json.dumps(tool.description, ensure_ascii=False)},'
        f'"parameters":{tool.parameters_json}}}'
    )
    return _print(
        "tool", tool.name, text, origins, tokenizer, tool.description, tool.parameters_json, ()
    )


def _rendered(
    kind: str,
    parts: list[Part],
    variables: dict[str, str | None],
    failures: list[str],
) -> list[tuple[str, str, str]]:
    """(name, raw text, rendered text) of each part; a part that fails to render is
    reported as written and its failure added to `failures`, so the report still works."""
    out = []
    for part in parts:
        try:
            rendered = interpolate(part.text, variables, f'{kind} "{part.name}"')
        except RenderFailure as error:
            failures.append(str(error))
            rendered = part.text
        out.append((part.name, part.text, rendered))
    return out


def _text_prints(
    kind: str,
    parts: list[tuple[str, str, str]],
    variables: dict[str, str | None],
    origins: dict[tuple[str, str], Origin],
    tokenizer: Tokenizer | None,
) -> list[PartPrint]:
    prints = []
    for name, raw, rendered in parts:
        if not rendered:
            continue  # empty parts are dropped from what the model sees
        used = tuple((ref, variables.get(ref)) for ref in dict.fromkeys(references(raw)))
        prints.append(_print(kind, name, rendered, origins, tokenizer, raw, "", used))
    return prints


def _print(
    kind: str,
    name: str,
    text: str,
    origins: dict[tuple[str, str], Origin],
    tokenizer: Tokenizer | None,
    raw: str,
    parameters: str,
    used: tuple[tuple[str, str | None], ...],
) -> PartPrint:
    encoded = text.encode()
    return PartPrint(
        kind=kind,
        name=name,
        origin=origins.get((kind, name), _UNKNOWN),
        bytes=len(encoded),
        tokens=tokenizer.count(text) if tokenizer else None,
        fingerprint=hashlib.sha256(encoded).hexdigest()[:16],
        raw=raw,
        parameters=parameters,
        variables=used,
    )


def _total(parts: list[PartPrint], separator: int) -> Size:
    size = sum(p.bytes for p in parts) + separator * max(0, len(parts) - 1)
    tokens = None if not parts or parts[0].tokens is None else sum(p.tokens or 0 for p in parts)
    return Size(size, tokens)


def _snapshot_size(contexts: list[tuple[str, str, str]], tokenizer: Tokenizer | None) -> Size:
    body = SECTION_SEPARATOR.join(rendered for _, _, rendered in contexts if rendered)
    snapshot = f"{CONTEXT_SNAPSHOT_HEADER}{SECTION_SEPARATOR}{body}" if body else ""
    return Size(len(snapshot.encode()), tokenizer.count(snapshot) if tokenizer else None)


def _stability(
    prefix: list[PartPrint], previous: list[PartPrint] | None, counting: bool
) -> tuple[Stability, int]:
    tools = _total([p for p in prefix if p.kind == "tool"], 0)
    prompt = _total([p for p in prefix if p.kind == "section"], SEPARATOR_BYTES)
    whole = Size(
        tools.bytes + prompt.bytes, _sum(tools.tokens, prompt.tokens) if counting else None
    )
    if previous is None:
        return Stability(False, 0, 0 if counting else None, whole, "", ""), 0
    index = 0
    while (
        index < len(prefix)
        and index < len(previous)
        and prefix[index].key == previous[index].key
        and prefix[index].fingerprint == previous[index].fingerprint
    ):
        index += 1
    stable = prefix[:index]
    stable_bytes = _stable_bytes(stable)
    stable_tokens = sum(p.tokens or 0 for p in stable) if counting else None
    if index == len(prefix) == len(previous):
        return Stability(True, whole.bytes, whole.tokens, whole, "", ""), index
    current = prefix[index] if index < len(prefix) else None
    before = previous[index] if index < len(previous) else None
    changed = current or before
    assert changed is not None
    return (
        Stability(
            True,
            stable_bytes,
            stable_tokens,
            whole,
            f'{changed.kind} "{changed.name}"',
            explain(current, before, prefix, previous),
        ),
        index,
    )


def _stable_bytes(stable: list[PartPrint]) -> int:
    sections = sum(1 for p in stable if p.kind == "section")
    return sum(p.bytes for p in stable) + SEPARATOR_BYTES * max(0, sections - 1)


def _sum(*sizes: int | None) -> int | None:
    return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


def explain(
    current: PartPrint | None,
    before: PartPrint | None,
    prefix: list[PartPrint],
    previous: list[PartPrint],
) -> str:
    """Why the prefix breaks at this position, in words a person acts on."""
    if current is None:
        assert before is not None
        return f'{before.kind} "{before.name}" removed'
    if before is None:
        return f'{current.kind} "{current.name}" added at the end' + _by_listener(current)
    if current.key == before.key:
        return _changed(current, before)
    if current.key not in {p.key for p in previous}:
        return f'{current.kind} "{current.name}" added before "{before.name}"' + _by_listener(
            current
        )
    if before.key not in {p.key for p in prefix}:
        return f'{before.kind} "{before.name}" removed'
    return f'{current.kind} "{current.name}" moved before "{before.name}"'


def _changed(current: PartPrint, before: PartPrint) -> str:
    if current.origin.kind is OriginKind.LISTENER:
        return f'listener "{current.origin.listener}" changed {current.kind} "{current.name}"'
    if current.kind == "tool":
        what = "parameters" if current.parameters != before.parameters else "description"
        return f'tool "{current.name}" {what} changed'
    if current.raw == before.raw:
        earlier = dict(before.variables)
        changed = [f"{{{{{n}}}}}" for n, v in current.variables if earlier.get(n, v) != v]
        if changed:
            noun = "variable" if len(changed) == 1 else "variables"
            because = f"{noun} {', '.join(changed)} changed"
            return f'{current.kind} "{current.name}" text changed ({because})'
    return f'{current.kind} "{current.name}" text changed'


def _by_listener(part: PartPrint) -> str:
    if part.origin.kind is OriginKind.LISTENER:
        return f' (by listener "{part.origin.listener}")'
    return ""
