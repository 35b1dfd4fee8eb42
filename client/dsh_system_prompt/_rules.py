"""Rules: waterfall steps the sidecar runs itself, in CEL (docs/protocol.md, "Rules").

`Rule` is what a rule does, `Mutation`'s constructors its operations (one each, applied in
order), `RulePart` a part an upsert adds or replaces. The expressions are CEL source text,
compiled and checked by the sidecar when the rule is registered or updated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import failure_policy_to_proto
from .errors import invalid_value
from .types import FailurePolicy


@dataclass(frozen=True)
class RulePart:
    """A section or context an upsert adds or replaces: `text` is a CEL string expression
    (`"'Be brief.'"`, `"'Agent ' + fields.agent"`). A part of that name keeps its place and
    gets the new text; a new one goes after every part whose order is at most `order`."""

    name: str
    order: float
    text: str

    def to_proto(self) -> pb.RulePart:
        if isinstance(self.order, bool) or not isinstance(self.order, int | float):
            raise invalid_value(f"a rule part's order must be a number, not {self.order!r}")
        if not math.isfinite(self.order):
            raise invalid_value(f"a rule part's order must be finite, not {self.order!r}")
        return pb.RulePart(name=_text(self.name, "name"), order=self.order, text=_text(self.text))


@dataclass(frozen=True)
class Mutation:
    """One operation of a rule; made by the constructors below, never by hand."""

    message: pb.RuleMutation = field(repr=False)

    @classmethod
    def drop_tools(cls, predicate: str) -> Mutation:
        """Remove the tools for which `predicate` (CEL over `tool`) is true."""
        return cls(pb.RuleMutation(drop_tools=_text(predicate)))

    @classmethod
    def keep_tools(cls, predicate: str) -> Mutation:
        """Keep only the tools for which `predicate` (CEL over `tool`) is true."""
        return cls(pb.RuleMutation(keep_tools=_text(predicate)))

    @classmethod
    def tool_order(cls, names: Sequence[str]) -> Mutation:
        """These tools first, in this order; every other tool after them, as it was."""
        listed = [_text(name, "tool name") for name in _sequence(names, "tool_order")]
        return cls(pb.RuleMutation(tool_order=pb.RuleToolOrder(names=listed)))

    @classmethod
    def upsert_sections(cls, *parts: RulePart) -> Mutation:
        """Add or replace sections by name."""
        return cls(pb.RuleMutation(upsert_sections=pb.RuleParts(parts=_parts(parts))))

    @classmethod
    def drop_sections(cls, predicate: str) -> Mutation:
        """Remove the sections for which `predicate` (CEL over `section`) is true."""
        return cls(pb.RuleMutation(drop_sections=_text(predicate)))

    @classmethod
    def upsert_contexts(cls, *parts: RulePart) -> Mutation:
        """Add or replace runtime contexts by name."""
        return cls(pb.RuleMutation(upsert_contexts=pb.RuleParts(parts=_parts(parts))))

    @classmethod
    def drop_contexts(cls, predicate: str) -> Mutation:
        """Remove the runtime contexts for which `predicate` (CEL over `context`) is true."""
        return cls(pb.RuleMutation(drop_contexts=_text(predicate)))

    @classmethod
    def set_variables(cls, values: Mapping[str, str | None]) -> Mutation:
        """Give each variable the value of its CEL string expression, or None: no value."""
        if not isinstance(values, Mapping):
            raise invalid_value("set_variables takes a mapping of names to expressions or None")
        message = pb.RuleVariableValues()
        for name, expression in values.items():
            variable = message.variables.add(name=_text(name, "variable name"))
            if expression is None:
                variable.unset.SetInParent()
            else:
                variable.expression = _text(expression)
        return cls(pb.RuleMutation(set_variables=message))


@dataclass(frozen=True)
class Rule:
    """What a rule does: when every `match` expression is true, its `mutations` in order.

    `variables` are named CEL sub-expressions its expressions read as `variables.NAME`;
    `failure_policy` FailurePolicy.IGNORE passes the rule over when an expression fails at
    run time (FAIL, the default, fails the assembly with RULE_FAILED).
    """

    mutations: Sequence[Mutation] = ()
    match: Sequence[str] = ()
    variables: Mapping[str, str] = field(default_factory=dict)
    failure_policy: FailurePolicy = FailurePolicy.FAIL

    def __post_init__(self) -> None:
        # lists and tuples alike: a rule given as lists equals the same rule read back
        for name in ("mutations", "match"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def to_proto(self) -> pb.RuleSpec:
        if not isinstance(self, Rule):
            raise invalid_value(f"a rule is a dsp.Rule, not {type(self).__name__}")
        spec = pb.RuleSpec(
            match=[_text(source) for source in _sequence(self.match, "match")],
            failure_policy=failure_policy_to_proto(self.failure_policy),
        )
        if not isinstance(self.variables, Mapping):
            raise invalid_value("a rule's variables are a mapping of names to expressions")
        for name, expression in self.variables.items():
            spec.variables.add(name=_text(name, "variable name"), expression=_text(expression))
        for mutation in _sequence(self.mutations, "mutations"):
            if not isinstance(mutation, Mutation):
                raise invalid_value(
                    f"a rule's mutations are made by dsp.Mutation, not {type(mutation).__name__}"
                )
            spec.mutations.append(mutation.message)
        return spec


def rule_from_proto(spec: pb.RuleSpec) -> Rule:
    """A rule as a listing shows it."""
    return Rule(
        mutations=tuple(Mutation(mutation) for mutation in spec.mutations),
        match=tuple(spec.match),
        variables={variable.name: variable.expression for variable in spec.variables},
        failure_policy=(
            FailurePolicy.IGNORE
            if spec.failure_policy == pb.FAILURE_POLICY_IGNORE
            else FailurePolicy.FAIL
        ),
    )


def rule_spec(rule: object) -> pb.RuleSpec:
    """A `Rule` as sent; anything else is refused here (INVALID_VALUE)."""
    if not isinstance(rule, Rule):
        raise invalid_value(f"a rule is a dsp.Rule, not {type(rule).__name__}")
    return rule.to_proto()


def _parts(parts: Sequence[RulePart]) -> list[pb.RulePart]:
    for part in parts:
        if not isinstance(part, RulePart):
            raise invalid_value(f"an upsert takes dsp.RulePart values, not {type(part).__name__}")
    return [part.to_proto() for part in parts]


def _sequence(values: object, what: str) -> Sequence[object]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise invalid_value(f"a rule's {what} is a list, not {type(values).__name__}")
    return values


def _text(value: object, what: str = "expression") -> str:
    if not isinstance(value, str):
        raise invalid_value(f"a rule's {what} must be a str, not {type(value).__name__}")
    return value
