"""Prompt-cache awareness: provenance, sizes and prefix stability of an assembly.

Model servers cache the longest identical prefix of a request. This module
lays an assembly out as the model server sees it (tools and system prompt in
the order of a `Layout`), measures it over the whole text, and compares it
with the previous reported assembly of the same history key: the true common
prefix in bytes and tokens, the first part that differs, why (`blame`),
what it costs, and a short diff of the change (`diff`). Its values are in `values`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace

from dsh_system_prompt_core import (
    CONTEXT_SNAPSHOT_HEADER,
    SECTION_SEPARATOR,
    RenderFailure,
    interpolate,
    references,
)

from ..registry import (
    Assembly,
    Origin,
    OriginKind,
    Origins,
    PartKey,
    PartKind,
    Skipped,
    Tool,
)
from .blame import explain
from .diff import bounded_diff, common_prefix
from .tokens import Tokenizer
from .values import (
    MAX_SKIPPED,
    Layout,
    PartPrint,
    Previous,
    Report,
    Size,
    Stability,
)
from .words import Words, joined, said

TOOL_SEPARATOR = "\n"  # between two tools' JSON in the tool block
BLOCK_SEPARATOR = SECTION_SEPARATOR  # between the tool block and the system prompt


def build_report(
    assembly: Assembly,
    tokenizer: Tokenizer | None,
    layout: Layout,
    previous: Previous | None,
    evicted: bool = False,
) -> tuple[Report, Previous]:
    """Report on `assembly` (tracked) against `previous`; also what the next one compares with.

    A `previous` laid out in another layout is not compared with (the texts differ
    by construction); `evicted` says an earlier report of the key was forgotten.
    """
    origins = assembly.origins or {}
    failures: list[str] = []
    tools = [_tool_print(tool, origins, tokenizer) for tool in assembly.tools]
    sections = _text_prints(PartKind.SECTION, assembly, origins, tokenizer, failures)
    contexts = _text_prints(PartKind.CONTEXT, assembly, origins, tokenizer, failures)
    tool_block = TOOL_SEPARATOR.join(text for _, text in tools)
    prompt = SECTION_SEPARATOR.join(text for _, text in sections)
    text, prefix = _lay_out(layout, tools, sections)
    ids = tokenizer.encode(text) if tokenizer else None
    current = Previous(
        layout=layout,
        parts=tuple(prefix),
        contexts={part.name: part.fingerprint for part, _ in contexts},
        text=text,
        token_ids=ids,
        trace=assembly.trace,
        variables={
            name: origins.get((PartKind.VARIABLE, name), _UNKNOWN) for name in assembly.variables
        },
    )
    whole = Size(bytes=len(text.encode()), tokens=None if ids is None else len(ids))
    if previous is not None and previous.layout is not layout:
        previous = None
    stability, stable_count = _stability(current, previous, whole, evicted)
    seen = stability.seen
    if seen.first_changed and assembly.skipped:  # a step left out may be why it broke
        why = said(seen.words, "; this assembly skipped ", _skipped_words(assembly.skipped))
        stability = replace(stability, seen=replace(seen, reason=why.text, steps=why.steps))
    report = Report(
        tokenizer=tokenizer.name if tokenizer else "",
        layout=layout,
        parts=[
            *((part, index < stable_count) for index, part in enumerate(prefix)),
            *((part, _context_stable(part, previous)) for part, _ in contexts),
        ],
        tools=_size(tool_block, tokenizer),
        prompt=_size(prompt, tokenizer),
        context_snapshot=_size(_snapshot(contexts), tokenizer),
        stability=stability,
        variables=list(current.variables.items()),
        render_error=failures[0] if failures else "",
        skipped=assembly.skipped,
    )
    return report, current


_UNKNOWN = Origin(kind=OriginKind.GLOBAL)


def _skipped_words(steps: tuple[Skipped, ...]) -> Words:
    """The first `MAX_SKIPPED` steps by name, the rest counted: a reason stays a few names
    long however many callbacks failed (the history keeps one per recent report)."""
    named = joined(", ", (said(_skipped_name(s), f" ({s.reason})") for s in steps[:MAX_SKIPPED]))
    more = len(steps) - MAX_SKIPPED
    return said(named, f" and {more} more") if more > 0 else named


def _skipped_name(step: Skipped) -> Origin | str:
    """A skipped listener or rule kept with its layer, as its origin describes it (`listener
    "x"`); a provider, or a step without a name, in words alone."""
    origin = step.origin()
    return origin if origin is not None and step.name else f'{step.kind.value} "{step.name}"'


def _lay_out(
    layout: Layout,
    tools: list[tuple[PartPrint, str]],
    sections: list[tuple[PartPrint, str]],
) -> tuple[str, list[PartPrint]]:
    """The prefix text in `layout`'s order, and each part with its place in it."""
    blocks = [(tools, TOOL_SEPARATOR), (sections, SECTION_SEPARATOR)]
    if layout is Layout.SYSTEM_FIRST:
        blocks.reverse()
    pieces: list[str] = []
    placed: list[PartPrint] = []
    length = 0
    for block, separator in blocks:
        if not block:
            continue
        if pieces:
            pieces.append(BLOCK_SEPARATOR)
            length += len(BLOCK_SEPARATOR)
        for index, (part, text) in enumerate(block):
            if index:
                pieces.append(separator)
                length += len(separator)
            pieces.append(text)
            placed.append(replace(part, start=length, end=length + len(text)))
            length += len(text)
    return "".join(pieces), placed


def _tool_print(tool: Tool, origins: Origins, tokenizer: Tokenizer | None) -> tuple[PartPrint, str]:
    # The shape adapters send: name, description, then the parameters JSON as registered.
    text = (
        f'{{"name":{json.dumps(tool.name, ensure_ascii=False)},'
        f'"description":{json.dumps(tool.description, ensure_ascii=False)},'
        f'"parameters":{tool.parameters_json}}}'
    )
    part = _print(
        PartKind.TOOL,
        tool.name,
        text,
        origins,
        tokenizer,
        tool.description,
        tool.parameters_json,
        (),
    )
    return part, text


def _text_prints(
    kind: PartKind,
    assembly: Assembly,
    origins: Origins,
    tokenizer: Tokenizer | None,
    failures: list[str],
) -> list[tuple[PartPrint, str]]:
    """Each non-empty rendered section or context; a part that fails to render is
    reported as written and its failure added to `failures`, so the report still works."""
    variables = assembly.variables
    prints = []
    for part in assembly.sections if kind is PartKind.SECTION else assembly.contexts:
        try:
            rendered = interpolate(part.text, variables, f'{kind} "{part.name}"')
        except RenderFailure as error:
            failures.append(str(error))
            rendered = part.text
        if not rendered:
            continue  # empty parts are dropped from what the model sees
        used = tuple((name, variables.get(name)) for name in dict.fromkeys(references(part.text)))
        printed = _print(kind, part.name, rendered, origins, tokenizer, part.text, "", used)
        prints.append((printed, rendered))
    return prints


def _print(
    kind: PartKind,
    name: str,
    text: str,
    origins: Origins,
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


def _snapshot(contexts: list[tuple[PartPrint, str]]) -> str:
    body = SECTION_SEPARATOR.join(text for _, text in contexts)
    return f"{CONTEXT_SNAPSHOT_HEADER}{SECTION_SEPARATOR}{body}" if body else ""


def _size(text: str, tokenizer: Tokenizer | None) -> Size:
    return Size(bytes=len(text.encode()), tokens=tokenizer.count(text) if tokenizer else None)


def _context_stable(part: PartPrint, previous: Previous | None) -> bool:
    return previous is not None and previous.contexts.get(part.name) == part.fingerprint


def _stability(
    current: Previous, previous: Previous | None, whole: Size, evicted: bool
) -> tuple[Stability, int]:
    """The comparison with `previous`, and how many leading parts are unchanged."""
    if previous is None:
        return Stability.first(whole, evicted), 0
    same = _same_parts(current.parts, previous.parts)
    if same == len(current.parts) == len(previous.parts):
        return Stability.compared(whole, stable=whole), same
    characters = common_prefix(current.text, previous.text)
    stable_bytes = len(current.text[:characters].encode())
    stable_tokens = None
    if current.token_ids is not None and previous.token_ids is not None:
        stable_tokens = common_prefix(current.token_ids, previous.token_ids)
    first_changed, reason, part = explain(same, current, previous)
    stable = Size(bytes=stable_bytes, tokens=stable_tokens)
    diff = _diff(part, current, previous)
    return Stability.compared(whole, stable, (first_changed, reason), diff), same


def _same_parts(current: Sequence[PartPrint], previous: Sequence[PartPrint]) -> int:
    index = 0
    while (
        index < len(current)
        and index < len(previous)
        and current[index].key == previous[index].key
        and current[index].fingerprint == previous[index].fingerprint
    ):
        index += 1
    return index


def _diff(key: PartKey, current: Previous, previous: Previous) -> str:
    return bounded_diff(
        _text_of(key, previous), _text_of(key, current), json_=key[0] is PartKind.TOOL
    )


def _text_of(key: PartKey, side: Previous) -> str:
    for part in side.parts:
        if part.key == key:
            return side.text[part.start : part.end]
    return ""
