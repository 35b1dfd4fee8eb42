"""Provenance values: what kind each part of an assembly is, and where it came from.

A leaf: it imports nothing of the registry, so `model` (whose `Assembly` holds
these) and `origins` (which records them) both import it, not each other.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace


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
    held: str | None = None  # a listener's or rule's layer (None: the global one)
    everywhere: bool = False  # a listener or rule registered with `global`

    @property
    def step(self) -> bool:
        """Whether a listener or rule made it: who is shown its name depends on `held`."""
        return self.kind in (OriginKind.LISTENER, OriginKind.RULE)

    def unnamed(self) -> Origin:
        """This step as a caller not shown its name is shown it: without its name, in its
        layer, or the global one when it runs everywhere (described by `unnamed_step`)."""
        return replace(self, listener="", held=None if self.everywhere else self.held)

    def describe(self) -> str:
        if self.kind is OriginKind.BUILTIN:
            return "built-in"
        if self.kind is OriginKind.GLOBAL:
            return "global"
        if self.step:  # one shown without its name (reports/shown.py) by its layer alone
            if not self.listener:
                return unnamed_step(self.kind.value, self.held, self.everywhere)
            return f'{self.kind.value} "{self.listener}"'
        if self.depth == 0:
            return f'scope "{self.scope}"'
        return f'scope "{self.scope}" (ancestor of "{self.for_scope}")'


def unnamed_step(kind: str, held: str | None, everywhere: bool) -> str:
    """How a listener or rule is named to a caller not shown its name: its kind and its layer,
    the global one when it runs everywhere (`a listener (global)`, `a rule in scope "x"`)."""
    where = " (global)" if everywhere or held is None else f' in scope "{held}"'
    return f"a {kind}{where}"


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
    origin: Origin | None = None  # who made it, with its layer; None for the first step

    def describe(self) -> str:
        """`listener "name"` or `rule "name"`, as a reason names the step; "" for the first
        step (what the registrations gave), which no listener or rule made."""
        return f'{self.kind} "{self.listener}"' if self.listener else ""


@dataclass(slots=True)
class Trace:
    """An assembly's scope chain and the steps its parts went through."""

    chain: tuple[str, ...]
    steps: list[Step] = field(default_factory=list)

    def record(self, values: Values, origin: Origin | None = None) -> None:
        """Add the step `origin` (a listener or rule; None for what the registrations gave)
        made, with the values it left (origins.snapshot)."""
        if origin is None:
            self.steps.append(Step(listener="", values=values))
            return
        kind = "rule" if origin.kind is OriginKind.RULE else "listener"
        self.steps.append(Step(origin.listener, values, kind, origin))
