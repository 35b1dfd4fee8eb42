"""Strict {{variable}} interpolation: pure functions shared by the client and the sidecar."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from .errors import RenderError

CONTEXT_SNAPSHOT_HEADER = (
    "Current runtime context. This snapshot supersedes earlier runtime-context snapshots."
)
_NAME = re.compile(r"[a-z][a-z0-9_]*")
# A complete group: "{{", no braces, "}}".
_GROUP = re.compile(r"\{\{([^{}]*)\}\}")
_SNIPPET_LIMIT = 40


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
    return f"{CONTEXT_SNAPSHOT_HEADER}\n\n{body}" if body else ""


def interpolate(text: str, variables: Mapping[str, str | None], where: str) -> str:
    """Replace every {{name}} in `text`; `where` names the part for errors."""
    if "{{" not in text:
        return text
    out: list[str] = []
    position = 0
    while (start := text.find("{{", position)) >= 0:
        group = _GROUP.match(text, start)
        if group is None:
            end = text.find("}}", start + 2)
            if end < 0:
                break  # a lone "{{" with no "}}" after it stays literal
            raise RenderError(
                f'malformed prompt variable reference at "{_snippet(text, start, end)}" in {where}'
            )
        out.append(text[position:start])
        out.append(_value(group.group(0), group.group(1), variables, where))
        position = group.end()
    out.append(text[position:])
    return "".join(out)


def _render_parts(
    parts: Sequence[NamedText], variables: Mapping[str, str | None], noun: str
) -> str:
    rendered = (interpolate(part.text, variables, f'{noun} "{part.name}"') for part in parts)
    return "\n\n".join(text for text in rendered if text)


def _value(reference: str, name: str, variables: Mapping[str, str | None], where: str) -> str:
    if _NAME.fullmatch(name) is None:
        raise RenderError(f'malformed prompt variable reference "{reference}" in {where}')
    if name not in variables:
        registered = ", ".join(variables) or "(none)"
        raise RenderError(
            f'unknown prompt variable "{reference}" in {where}; registered variables: {registered}'
        )
    value = variables[name]
    if value is None:
        raise RenderError(f'prompt variable "{reference}" has no value for this assembly ({where})')
    return value


def _snippet(text: str, start: int, end: int) -> str:
    # From the "{{" through the run of closing braces that follows it.
    stop = end + 2
    while stop < len(text) and text[stop] == "}":
        stop += 1
    if stop - start > _SNIPPET_LIMIT:
        return text[start : start + _SNIPPET_LIMIT] + "…"
    return text[start:stop]
