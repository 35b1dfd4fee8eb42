"""A plan's per-part caches: each part's field encoding and interpolated text, kept by
position with the part they were made from, so a dynamic plan's response is joined from
the kept ones of the parts that did not change and fresh ones of those that did.

A kept value is reused only for an equal part (and, for a text, equal variables):
parts are immutable values, so an equal part encodes and renders the same. The
caches live on the plan (`Plan.part_caches`), which a change replaces; what they
hold is one assembly's parts, since each call keeps only its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from dsh_system_prompt_core import CONTEXT_SNAPSHOT_HEADER, SECTION_SEPARATOR, interpolate

from ...registry import Assembly, Part, Tool
from ...registry.assembly.plan import Plan
from .. import encoding

T = TypeVar("T")
Variables = Mapping[str, str | None]


class _Fields(Generic[T]):
    """One list of an assembly's parts as last encoded: the parts, their fields, the join."""

    __slots__ = ("_fields", "_joined", "_parts")

    def __init__(self) -> None:
        self._parts: list[T] = []
        self._fields: list[bytes] = []
        self._joined = b""

    def join(self, parts: Sequence[T], encode: Callable[[T], bytes]) -> bytes:
        """The parts' fields joined: the kept join when every part is unchanged, else
        the kept field of each unchanged part (by position) and fresh ones."""
        if parts == self._parts:  # compared in C, by identity first
            return self._joined
        if len(parts) == len(self._parts):
            kept = zip(parts, self._parts, self._fields, strict=True)
            fields = [field if part == old else encode(part) for part, old, field in kept]
        else:  # a listener added or removed parts: positions moved
            fields = [encode(part) for part in parts]
        self._parts, self._fields, self._joined = list(parts), fields, b"".join(fields)
        return self._joined


class _Texts:
    """One list of parts as last interpolated, under the variables it was done with."""

    __slots__ = ("_joined", "_noun", "_parts", "_texts", "_variables")

    def __init__(self, noun: str) -> None:
        self._noun = noun
        self._parts: list[Part] = []
        self._texts: list[str] = []
        self._variables: dict[str, str | None] | None = None
        self._joined = ""

    def render(self, parts: Sequence[Part], variables: Variables) -> str:
        """render_prompt's join of the interpolated, non-empty texts (RenderFailure as it)."""
        same_variables = variables == self._variables
        if same_variables and parts == self._parts:
            return self._joined
        if same_variables and len(parts) == len(self._parts):
            kept = zip(parts, self._parts, self._texts, strict=True)
            texts = [
                text if part == old else self._text(part, variables) for part, old, text in kept
            ]
        else:
            texts = [self._text(part, variables) for part in parts]
        # kept only once every part rendered: a failure leaves the last good ones
        joined = SECTION_SEPARATOR.join(text for text in texts if text)
        self._parts, self._texts, self._joined = list(parts), texts, joined
        self._variables = dict(variables)
        return joined

    def _text(self, part: Part, variables: Variables) -> str:
        return interpolate(part.text, variables, f'{self._noun} "{part.name}"')


@dataclass(slots=True)
class PartCaches:
    """One plan's encodings and renderings of its assemblies' parts, by kind."""

    sections: _Fields[Part] = field(default_factory=_Fields)
    contexts: _Fields[Part] = field(default_factory=_Fields)
    tools: _Fields[Tool] = field(default_factory=_Fields)
    variables: _Fields[tuple[str, str | None]] = field(default_factory=_Fields)
    prompt: _Texts = field(default_factory=lambda: _Texts("section"))
    snapshot: _Texts = field(default_factory=lambda: _Texts("context"))

    def encoding(self, assembly: Assembly) -> bytes:
        """assembly_encoding(assembly), from the kept fields of its unchanged parts."""
        return b"".join(
            (
                self.sections.join(assembly.sections, encoding.section_field),
                self.contexts.join(assembly.contexts, encoding.context_field),
                self.tools.join(assembly.tools, encoding.tool_field),
                self.variables.join(list(assembly.variables.items()), encoding.variable_field),
            )
        )

    def render_prompt(self, assembly: Assembly) -> str:
        """render_prompt(assembly), from the kept texts of its unchanged sections."""
        return self.prompt.render(assembly.sections, assembly.variables)

    def render_context_snapshot(self, assembly: Assembly) -> str:
        """render_context_snapshot(assembly), likewise for its contexts."""
        body = self.snapshot.render(assembly.contexts, assembly.variables)
        return f"{CONTEXT_SNAPSHOT_HEADER}{SECTION_SEPARATOR}{body}" if body else ""


def of(plan: Plan) -> PartCaches:
    """The plan's caches, made at its first response."""
    caches = plan.part_caches
    if not isinstance(caches, PartCaches):
        caches = plan.part_caches = PartCaches()
    return caches
