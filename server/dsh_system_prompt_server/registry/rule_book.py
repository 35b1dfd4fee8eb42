"""The registry's rules as registrations: a session's rule admitted (its name in its layer,
the counts) and compiled; the operator's (the config's `[[rules]]`) kept as the config says,
by what changed between two configs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from . import errors
from .admission import Admission
from .callbacks import ListenerIndex
from .model import AnyRegistration, RuleRegistration
from .rules import OperatorRule, Rule, compile_rule


@dataclass
class OperatorChanges:
    """What a new config does to the operator's rules in force."""

    gone: list[RuleRegistration] = field(default_factory=list)
    changed: list[tuple[RuleRegistration, Rule]] = field(default_factory=list)
    new: list[OperatorRule] = field(default_factory=list)  # in the config's order


class RuleBook:
    """The checks a new rule passes, and the operator's rules in force by name."""

    def __init__(self, steps: ListenerIndex, admission: Admission) -> None:
        self._steps = steps
        self._admission = admission
        self.operator: dict[str, RuleRegistration] = {}

    def admitted(
        self, name: str, spec: pb.RuleSpec, layer: str | None, owned: Iterable[AnyRegistration]
    ) -> Rule:
        """A session's new rule `name` in `layer`, its owner holding `owned`: checked and
        compiled (the owner's quota of registrations is checked by the caller)."""
        limits = self._admission.limits
        if not name:
            raise errors.empty_name("rule")
        limits.check_name("rule", name)
        if any(rule.name == name for rule in self._steps.rules_in(layer)):
            raise errors.duplicate_rule(name, layer)
        rules = sum(isinstance(entry, RuleRegistration) for entry in owned)
        self._admission.check_rules(self._steps.rules - len(self.operator), rules)
        return compile_rule(name, spec, limits)

    def operator_changes(self, rules: tuple[OperatorRule, ...]) -> OperatorChanges:
        """Those gone (or moved: a new scope pattern or prepend), those whose definition
        changed, and the new ones."""
        wanted = {rule.name: rule for rule in rules}
        changes = OperatorChanges()
        for name, entry in list(self.operator.items()):
            given = wanted.get(name)
            moved = given is not None and (given.pattern, given.prepend) != (
                entry.pattern,
                entry.position < 0,
            )
            if given is None or moved:
                changes.gone.append(self.operator.pop(name))
            elif entry.value.spec != given.spec:
                changes.changed.append((entry, given.compiled))
        changes.new = [rule for rule in rules if rule.name not in self.operator]
        return changes
