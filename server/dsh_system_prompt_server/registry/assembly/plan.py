"""The plan of an assembly: the registrations it works on for one scope, at one revision of
its chain (revisions.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from .. import errors
from ..callbacks import combined
from ..layers import Layer
from ..model import (
    Assembly,
    CachePolicy,
    ContextRegistration,
    Dynamic,
    RuleRegistration,
    SectionRegistration,
    Skipped,
    StepRegistration,
    ToolsRegistration,
    ValueRegistration,
    VariableRegistration,
)

R = TypeVar("R", bound=ValueRegistration)
Ordered = TypeVar("Ordered", SectionRegistration, ContextRegistration)


@dataclass(slots=True, weakref_slot=True)  # its part caches go with it (rpc/assemble)
class Plan:
    """The registrations an assembly for one scope works on, at one revision.

    A plan does not change once made, so the registry reuses it until the next
    registration or disposal in its chain's layers. `revision` is the chain's (the last
    change to what the plan is made of), not the registry's. A static plan (no dynamic provider, no
    listener) always yields the same assembly: it is kept in `result`.
    """

    revision: int
    chain: list[str]
    suppressed: bool
    variables: list[VariableRegistration]
    sections: list[SectionRegistration]
    contexts: list[ContextRegistration]
    tools: list[ToolsRegistration]
    listeners: list[StepRegistration]  # the waterfall's steps: listeners and rules
    # The steps and dynamic providers out of their owner's reach (registry/reach.py): not
    # run, each named in every assembly's `skipped`; a provider's part is left out.
    out_of_reach: tuple[Skipped, ...] = ()
    dynamic: list[tuple[ValueRegistration, Dynamic]] = field(init=False)
    is_static: bool = field(init=False)
    # Its only non-static steps are rules (no listener, no dynamic provider, none passed
    # over for reach): its answer is a function of the scope and the fields alone.
    rules_only: bool = field(init=False)
    # The steps from the first listener after the last step that cannot be cached: their
    # result is kept for their input, under `tail_policy` (a rule is cacheable by the context).
    # Rules before that listener are not in it: a rule runs again for less than its result
    # costs to keep and find (copying and sizing both assemblies, comparing the input), and a
    # plan whose steps are all cacheable is answered from the kept responses anyway.
    cacheable_tail: list[StepRegistration] = field(init=False)
    tail_policy: CachePolicy | None = field(init=False)
    # Every callback declared a policy; this is them together (None otherwise).
    policy: CachePolicy | None = field(init=False)
    result: Assembly | None = None
    # With listeners but no dynamic provider, the assembly handed to the first listener is
    # the same at every assembly: made once and kept here (steps never change one they
    # are handed; a listener stream then names its parts by slot without comparing them).
    prelude: Assembly | None = None
    # What of that assembly is the same at every assembly of a plan with providers
    # (prelude.py's _Made: its static parts, its tools when every provider is static).
    made: object = None
    # The rpc layer's per-part encodings and renderings of this plan's assemblies
    # (rpc/part_caches.py): a change makes a new plan, so none outlives its parts.
    part_caches: object = None
    # Its rules' view of the parts' orders ("sections"/"contexts": name -> order), made at
    # its first assembly (rule_steps.py); None while it has no rule.
    part_orders: dict[str, dict[str, float]] | None = field(init=False, default=None)
    has_rules: bool = field(init=False)
    _complete: list[SectionRegistration] = field(init=False)

    def __post_init__(self) -> None:
        entries: list[ValueRegistration] = [
            *self.variables,
            *self.sections,
            *self.contexts,
            *self.tools,
        ]
        passed = {skipped.registration_id for skipped in self.out_of_reach}
        self.dynamic = [
            (entry, entry.value)
            for entry in entries
            if isinstance(entry.value, Dynamic) and entry.id not in passed
        ]
        self.is_static = not self.listeners and not self.dynamic
        self.has_rules = any(isinstance(entry, RuleRegistration) for entry in self.listeners)
        self._complete = [entry for entry in self.sections if entry.complete]
        self.rules_only = (
            bool(self.listeners)
            and not self.dynamic
            and not self.out_of_reach
            and all(isinstance(entry, RuleRegistration) for entry in self.listeners)
        )
        uncached = [i for i, entry in enumerate(self.listeners) if entry.cache is None]
        start = uncached[-1] + 1 if uncached else 0
        while start < len(self.listeners) and isinstance(self.listeners[start], RuleRegistration):
            start += 1
        self.cacheable_tail = self.listeners[start:]
        tail = [entry.cache for entry in self.cacheable_tail if entry.cache is not None]
        self.tail_policy = combined(tail) if tail else None
        providers = [value.cache for _, value in self.dynamic]
        steps = [entry.cache for entry in self.listeners if entry.cache is not None]
        policies = [policy for policy in providers if policy is not None] + steps
        cacheable = not uncached and None not in providers
        self.policy = combined(policies) if cacheable and policies else None

    def callbacks(self) -> list[StepRegistration | ValueRegistration]:
        """What runs for an assembly of this plan: its steps and dynamic providers."""
        return [*self.listeners, *(entry for entry, _ in self.dynamic)]

    def without(self, out_of_reach: Sequence[Skipped]) -> Plan:
        """This plan with `out_of_reach` passed over: those steps not run, those
        providers not asked (their parts left out), each named in `skipped`."""
        passed = {skipped.registration_id for skipped in out_of_reach}
        listeners = [entry for entry in self.listeners if entry.id not in passed]
        return replace(self, listeners=listeners, out_of_reach=tuple(out_of_reach))

    @property
    def scope(self) -> str | None:
        """The scope whose layers the plan joins; None for the global layer alone."""
        return self.chain[0] if self.chain else None

    def complete_section(self) -> SectionRegistration | None:
        """The effective complete section; more than one rejects the assembly."""
        complete = self._complete
        if len(complete) > 1:
            raise errors.multiple_complete(entry.name for entry in complete)
        return complete[0] if complete else None


def plan_of(
    revision: int,
    chain: list[str],
    layers: Sequence[Layer],
    include_runtime_context: bool,
    listeners: list[StepRegistration],
) -> Plan:
    """The plan over `layers`, farthest first: the global one, then the chain's scopes
    down to the assembly's own; `listeners` are those admitted for `chain`, in order."""
    suppressed = not include_runtime_context or any(layer.suppressors for layer in layers)
    return Plan(
        revision=revision,
        chain=chain,
        suppressed=suppressed,
        variables=list(_merged(layer.variables for layer in layers).values()),
        sections=_sorted(_merged(layer.sections for layer in layers)),
        contexts=[] if suppressed else _sorted(_merged(layer.contexts for layer in layers)),
        tools=[tools for layer in layers for tools in layer.tools.values()],
        listeners=listeners,
    )


def _merged(layers: Iterable[dict[str, R]]) -> dict[str, R]:
    # Farther layers first: a nearer layer's entry replaces the value but keeps
    # the position where the name first appeared.
    merged: dict[str, R] = {}
    for layer in layers:
        merged.update(layer)
    return merged


def _sorted(merged: dict[str, Ordered]) -> list[Ordered]:
    return sorted(merged.values(), key=lambda entry: entry.order)
