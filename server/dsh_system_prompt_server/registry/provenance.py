"""Provenance values: what kind each part of an assembly is, and where it came from.

A leaf: it imports nothing of the registry, so `model` (whose `Assembly` holds
these) and `origins` (which records them) both import it, not each other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class PartKind(enum.StrEnum):
    """What a part of an assembly is, in reports and provenance.

    Not a registration `Kind`: a `tools` registration gives many `tool` parts,
    and suppressors, listeners, scope handles and config are never parts.
    """

    SECTION = "section"
    CONTEXT = "context"
    TOOL = "tool"
    VARIABLE = "variable"


PartKey = tuple[PartKind, str]  # (kind of part, name): a part within one assembly


class OriginKind(enum.Enum):
    BUILTIN = "builtin"
    GLOBAL = "global"
    SCOPE = "scope"
    LISTENER = "listener"
    RULE = "rule"


@dataclass(frozen=True, slots=True)
class Origin:
    """A part's origin: the built-ins, the global layer, a scope on the chain, a listener or
    a rule (`listener` then holds the step's name)."""

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
        if self.kind is OriginKind.RULE:
            return f'rule "{self.listener}"'
        if self.depth == 0:
            return f'scope "{self.scope}"'
        return f'scope "{self.scope}" (ancestor of "{self.for_scope}")'


# Each part -> where it came from; kinds: section, context, tool, variable.
Origins = dict[PartKey, Origin]

# Each part -> a hash of its value at one step; kinds: section, tool, variable.
Values = dict[PartKey, int]


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
    kind: str = "listener"  # what made it: "listener" or "rule" (its name is `listener`)

    def describe(self) -> str:
        """`listener "name"` or `rule "name"`, as a reason names the step; "" for the first
        step (what the registrations gave), which no listener or rule made."""
        return f'{self.kind} "{self.listener}"' if self.listener else ""


@dataclass(slots=True)
class Trace:
    """An assembly's scope chain and the steps its parts went through."""

    chain: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)

    def record(self, listener: str, values: Values, kind: str = "listener") -> None:
        """Add the step `listener` (a listener, or a rule of that name) made, with the values
        it left (origins.snapshot)."""
        self.steps.append(Step(listener=listener, values=values, kind=kind))
