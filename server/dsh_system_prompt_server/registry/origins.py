"""Provenance: where each part of an assembly came from (asked for by reports)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .model import SIDECAR_OWNER, Assembly, Registration


class OriginKind(enum.Enum):
    BUILTIN = "builtin"
    GLOBAL = "global"
    SCOPE = "scope"
    LISTENER = "listener"


@dataclass(frozen=True, slots=True)
class Origin:
    """A part's origin: the built-ins, the global layer, a scope on the chain, or a listener."""

    kind: OriginKind
    scope: str | None = None
    depth: int = 0  # for SCOPE: 0 is the assembly's own scope, 1 its parent, ...
    listener: str = ""
    for_scope: str | None = None  # the assembly's scope, for the description

    def describe(self) -> str:
        if self.kind is OriginKind.BUILTIN:
            return "built-in"
        if self.kind is OriginKind.GLOBAL:
            return "global"
        if self.kind is OriginKind.LISTENER:
            return f'listener "{self.listener}"'
        if self.depth == 0:
            return f'scope "{self.scope}"'
        return f'scope "{self.scope}" (ancestor of "{self.for_scope}")'


# (kind of part, name) -> where it came from; kinds: section, context, tool, variable.
Origins = dict[tuple[str, str], Origin]


def entry_origin(entry: Registration[Any], chain: list[str]) -> Origin:
    """Where a registration's part comes from, seen from the scope `chain[0]`."""
    if entry.owner == SIDECAR_OWNER:
        return Origin(OriginKind.BUILTIN)
    if entry.scope is None:
        return Origin(OriginKind.GLOBAL)
    return Origin(
        OriginKind.SCOPE,
        entry.scope,
        chain.index(entry.scope),
        for_scope=chain[0] if chain else None,
    )


def record_changes(origins: Origins, before: Assembly, after: Assembly, listener: str) -> None:
    """Credit `listener` with every part of `after` it added or changed since `before`."""
    origin = Origin(OriginKind.LISTENER, listener=listener)
    for kind, old, new in (
        ("section", before.sections, after.sections),
        ("context", before.contexts, after.contexts),
    ):
        previous = {part.name: part.text for part in old}
        for part in new:
            if previous.get(part.name) != part.text:
                origins[(kind, part.name)] = origin
    previous_tools = {tool.name: tool for tool in before.tools}
    for tool in after.tools:
        if previous_tools.get(tool.name) != tool:
            origins[("tool", tool.name)] = origin
    for name, value in after.variables.items():
        if name not in before.variables or before.variables[name] != value:
            origins[("variable", name)] = origin


# (kind of part, name) -> a hash of its value at one step; kinds: section, tool, variable.
Values = dict[tuple[str, str], int]


@dataclass(frozen=True, slots=True)
class Step:
    """The prefix-relevant values after one step of an assembly.

    The first step (`listener` "") is what the registrations and providers
    gave; each later one is what a listener handed on or returned, in the
    order the data flowed (a listener appears twice when it works both
    before and after calling next()).
    """

    listener: str
    values: Values


@dataclass(slots=True)
class Trace:
    """An assembly's scope chain and the steps its parts went through."""

    chain: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)

    def record(self, listener: str, assembly: Assembly) -> None:
        self.steps.append(Step(listener, snapshot(assembly)))


def snapshot(assembly: Assembly) -> Values:
    """Hashes of the sections, tools and variables of `assembly` (contexts are not prefix)."""
    values: Values = {("section", part.name): hash(part.text) for part in assembly.sections}
    for tool in assembly.tools:
        values[("tool", tool.name)] = hash((tool.description, tool.parameters_json))
    for name, value in assembly.variables.items():
        values[("variable", name)] = hash(value)
    return values
