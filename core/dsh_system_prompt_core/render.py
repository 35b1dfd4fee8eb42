"""Strict {{variable}} interpolation: pure functions shared by the client and the sidecar."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .names import CONTEXT_SNAPSHOT_HEADER, SECTION_SEPARATOR, is_variable_name

# A complete group: "{{", no braces, "}}".
_GROUP = re.compile(r"\{\{([^{}]*)\}\}")
_SNIPPET_LIMIT = 40


class RenderFailure(Exception):
    """Strict interpolation failed; the message is the contract's wording."""


class NamedText(Protocol):
    """A section or context: anything with a name and a text."""

    @property
    def name(self) -> str: ...

    @property
    def text(self) -> str: ...


class Renderable(Protocol):
    """What rendering reads from an assembly."""

    @property
    def sections(self) -> Sequence[NamedText]: ...

    @property
    def contexts(self) -> Sequence[NamedText]: ...

    @property
    def variables(self) -> Mapping[str, str | None]: ...


def render_prompt(assembly: Renderable) -> str:
    """Interpolate every section, drop the empty ones, join with one blank line."""
    return _render_parts(assembly.sections, assembly.variables, "section")


def render_context_snapshot(assembly: Renderable) -> str:
    """The runtime-context snapshot, or "" when no context text is left."""
    body = _render_parts(assembly.contexts, assembly.variables, "context")
    return f"{CONTEXT_SNAPSHOT_HEADER}{SECTION_SEPARATOR}{body}" if body else ""


def interpolate(text: str, variables: Mapping[str, str | None], where: str) -> str:
    """Replace every {{name}} in `text`; `where` names the part for errors."""
    if "{{" not in text:
        return text
    out: list[str] = []
    for piece in _compile(text):
        if isinstance(piece, str):
            out.append(piece)
        else:
            out.append(piece.resolve(variables, where))
    return "".join(out)


def check_template(text: str, where: str) -> None:
    """Raise RenderFailure when `text` holds a malformed {{ }} reference; unknown names
    pass (their variables may be registered later)."""
    if "{{" not in text:
        return
    for piece in _compile(text):
        if isinstance(piece, _Reference) and (problem := piece.malformed(where)):
            raise RenderFailure(problem)


def references(text: str) -> list[str]:
    """The variable names that `text` references with complete {{name}} groups, in order."""
    if "{{" not in text:
        return []
    return [p.name for p in _compile(text) if isinstance(p, _Reference) and p.name is not None]


@dataclass(frozen=True, slots=True)
class _Reference:
    """A complete {{...}} group, or a malformed opening, found in a text."""

    reference: str  # the group as written, or the snippet of a malformed opening
    name: str | None  # the variable's name; None for a malformed opening

    def malformed(self, where: str) -> str | None:
        """The contract's message when this reference can never resolve, else None."""
        if self.name is None:
            return f'malformed prompt variable reference at "{self.reference}" in {where}'
        if not is_variable_name(self.name):
            return f'malformed prompt variable reference "{self.reference}" in {where}'
        return None

    def resolve(self, variables: Mapping[str, str | None], where: str) -> str:
        if problem := self.malformed(where):
            raise RenderFailure(problem)
        assert self.name is not None  # malformed() said so
        if self.name not in variables:
            registered = ", ".join(variables) or "(none)"
            raise RenderFailure(
                f'unknown prompt variable "{self.reference}" in {where};'
                f" registered variables: {registered}"
            )
        value = variables[self.name]
        if value is None:
            raise RenderFailure(
                f'prompt variable "{self.reference}" has no value for this assembly ({where})'
            )
        return value


@functools.lru_cache(maxsize=4096)
def _compile(text: str) -> tuple[str | _Reference, ...]:
    # Texts repeat from one assembly to the next: scan each once, then only substitute.
    pieces: list[str | _Reference] = []
    position = 0
    while (start := text.find("{{", position)) >= 0:
        group = _GROUP.match(text, start)
        if group is None:
            end = text.find("}}", start + 2)
            if end < 0:
                break  # a lone "{{" with no "}}" after it stays literal
            pieces.append(text[position:start])
            pieces.append(_Reference(_snippet(text, start, end), None))
            return tuple(pieces)  # rendering stops at the first malformed opening
        pieces.append(text[position:start])
        pieces.append(_Reference(group.group(0), group.group(1)))
        position = group.end()
    pieces.append(text[position:])
    return tuple(pieces)


def _render_parts(
    parts: Sequence[NamedText], variables: Mapping[str, str | None], noun: str
) -> str:
    rendered = (interpolate(part.text, variables, f'{noun} "{part.name}"') for part in parts)
    return SECTION_SEPARATOR.join(text for text in rendered if text)


def _snippet(text: str, start: int, end: int) -> str:
    # From the "{{" through the run of closing braces that follows it.
    stop = end + 2
    while stop < len(text) and text[stop] == "}":
        stop += 1
    if stop - start > _SNIPPET_LIMIT:
        return text[start : start + _SNIPPET_LIMIT] + "…"
    return text[start:stop]
