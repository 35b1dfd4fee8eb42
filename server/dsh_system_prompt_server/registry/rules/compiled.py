"""A rule compiled from its definition (the proto's RuleSpec), checked at registration: every
expression parsed and type checked, sizes and names bounded, or a RULE_INVALID refusal naming
the rule, the expression's path and CEL's message with its position."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason, is_variable_name

from ..errors import RegistryError, Status
from ..limits import Limits
from ..model import FailurePolicy
from .cost import Sizes, over_items
from .environment import CelRefusal, Environment, Program, Wanted

# The parts an upsert or drop works on, by operation.
PART_LISTS = {
    "upsert_sections": "sections",
    "upsert_contexts": "contexts",
    "drop_sections": "sections",
    "drop_contexts": "contexts",
}


@dataclass(frozen=True, slots=True)
class Filter:
    """drop_tools, keep_tools, drop_sections, drop_contexts: a predicate over each item."""

    items: str  # "tools", "sections" or "contexts"
    keep: bool  # keep those for which it is true (keep_tools); else drop them
    predicate: Program


@dataclass(frozen=True, slots=True)
class ToolOrder:
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Upsert:
    """upsert_sections, upsert_contexts: (name, order, text) for each part."""

    parts_of: str  # "sections" or "contexts"
    parts: tuple[tuple[str, float, Program], ...]


@dataclass(frozen=True, slots=True)
class SetVariables:
    values: tuple[tuple[str, Program | None], ...]  # None: no value


Mutation = Filter | ToolOrder | Upsert | SetVariables


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule ready to run: its definition as given, its compiled expressions, its policy.

    The environment is kept for the bindings of its evaluations (an activation)."""

    name: str
    spec: pb.RuleSpec
    match: tuple[Program, ...]
    variables: dict[str, Program]
    mutations: tuple[Mutation, ...]
    failure_policy: FailurePolicy
    environment: Environment
    reads_assembly: bool  # any of its expressions does: the assembly is converted for it
    reads_items: bool  # it reads the assembly or judges its items: their counts are bounded
    cost: int  # the worst case of one application, estimated (cost.py)


def invalid(name: str, message: str) -> RegistryError:
    """RULE_INVALID, naming the rule."""
    return RegistryError(Status.INVALID_ARGUMENT, Reason.RULE_INVALID, f'rule "{name}": {message}')


def compile_rule(name: str, spec: pb.RuleSpec, limits: Limits) -> Rule:
    """`spec` compiled for the rule `name`, or RULE_INVALID (nothing half-made is kept)."""
    return _Compiler(name, limits).rule(spec)


class _Compiler:
    def __init__(self, name: str, limits: Limits) -> None:
        self.name = name
        self.limits = limits
        self.expressions = 0
        self.environment = Environment(
            Sizes(
                fields_bytes=limits.max_rule_fields_bytes,
                items=limits.max_rule_items,
                text_bytes=limits.max_text_bytes,
                name_bytes=limits.max_name_bytes,
                schema_bytes=limits.max_tool_schema_bytes,
            )
        )

    def rule(self, spec: pb.RuleSpec) -> Rule:
        limits = self.limits
        limits.check_count("rule match", len(spec.match))
        limits.check_count("rule variables", len(spec.variables))
        limits.check_count("rule mutations", len(spec.mutations))
        match = tuple(
            self.expression(f"match[{i}]", source, Wanted.BOOL)
            for i, source in enumerate(spec.match)
        )
        variables: dict[str, Program] = {}
        for variable in spec.variables:
            path = f"variables.{variable.name}"
            self.variable_name(path, variable.name)
            if variable.name in variables:
                raise invalid(self.name, f"{path}: the rule declares it twice")
            program = self.expression(path, variable.expression, Wanted.ANY)
            variables[variable.name] = program
            self.environment.declare(variable.name, program.bound)
        mutations = tuple(
            self.mutation(f"mutations[{i}]", mutation) for i, mutation in enumerate(spec.mutations)
        )
        programs = [*match, *variables.values(), *_programs(mutations)]
        for program in programs:  # what the loop waits for: one evaluation (applied.py)
            once = _cost(program, limits.max_rule_items)
            if once > limits.max_rule_evaluation_cost:
                raise invalid(
                    self.name,
                    f"{program.path}: one evaluation's worst case is estimated at {once:,} cost"
                    f" units, over the limit of {limits.max_rule_evaluation_cost:,}"
                    " (limits.max_rule_evaluation_cost; a unit is about a nanosecond)",
                )
        costs = [(p.path, _cost(p, limits.max_rule_items)) for p in programs]
        cost = sum(each for _, each in costs)
        if cost > limits.max_rule_cost:
            path, dearest = max(costs, key=lambda pair: pair[1])
            raise invalid(
                self.name,
                f"{path}: its worst case is estimated at {dearest:,} cost units, the rule's at"
                f" {cost:,}, over the limit of {limits.max_rule_cost:,}"
                " (limits.max_rule_cost; a unit is about a nanosecond)",
            )
        kept = pb.RuleSpec()
        kept.CopyFrom(spec)  # the caller's message may change after this
        return Rule(
            name=self.name,
            spec=kept,
            failure_policy=_failure_policy(spec.failure_policy),
            match=match,
            variables=variables,
            mutations=mutations,
            environment=self.environment,
            reads_assembly=any(program.reads_assembly for program in programs),
            reads_items=any(p.reads_assembly or p.over_items for p in programs),
            cost=cost,
        )

    def mutation(self, path: str, mutation: pb.RuleMutation) -> Mutation:
        operation = mutation.WhichOneof("operation")
        if operation is None:
            raise invalid(self.name, f"{path}: a mutation needs one operation")
        path = f"{path}.{operation}"
        if operation in ("drop_tools", "keep_tools"):
            source = getattr(mutation, operation)
            predicate = self.expression(path, source, Wanted.BOOL, "tool")
            return Filter("tools", operation == "keep_tools", predicate)
        if operation in ("drop_sections", "drop_contexts"):
            item = "section" if operation == "drop_sections" else "context"
            predicate = self.expression(path, getattr(mutation, operation), Wanted.BOOL, item)
            return Filter(PART_LISTS[operation], False, predicate)
        if operation == "tool_order":
            names = tuple(mutation.tool_order.names)
            self.limits.check_count(f'rule "{self.name}" {path}', len(names))
            for name in names:
                self.limits.check_name("tool", name)
                if not name:
                    raise invalid(self.name, f"{path}: tool names must be non-empty")
            if len(set(names)) != len(names):
                raise invalid(self.name, f"{path}: lists a tool twice")
            return ToolOrder(names)
        if operation in ("upsert_sections", "upsert_contexts"):
            return self.upsert(path, operation, getattr(mutation, operation))
        return self.set_variables(path, mutation.set_variables)

    def upsert(self, path: str, operation: str, given: pb.RuleParts) -> Upsert:
        self.limits.check_count(f'rule "{self.name}" {path}', len(given.parts))
        parts = []
        seen: set[str] = set()
        for j, part in enumerate(given.parts):
            where = f"{path}[{j}]"
            if not part.name:
                raise invalid(self.name, f"{where}.name: part names must be non-empty")
            self.limits.check_name("prompt part", part.name)
            if part.name in seen:
                raise invalid(self.name, f'{where}.name: "{part.name}" is upserted twice')
            seen.add(part.name)
            if not math.isfinite(part.order):
                raise invalid(self.name, f"{where}.order: must be a finite number")
            text = self.expression(f"{where}.text", part.text, Wanted.STRING)
            parts.append((part.name, part.order, text))
        return Upsert(PART_LISTS[operation], tuple(parts))

    def set_variables(self, path: str, given: pb.RuleVariableValues) -> SetVariables:
        self.limits.check_count(f'rule "{self.name}" {path}', len(given.variables))
        values: list[tuple[str, Program | None]] = []
        for j, variable in enumerate(given.variables):
            where = f"{path}[{j}]"
            self.variable_name(f"{where}.name", variable.name)
            case = variable.WhichOneof("value")
            if case is None:
                raise invalid(self.name, f"{where}: needs an expression or unset")
            program = None
            if case == "expression":
                program = self.expression(f"{where}.value", variable.expression, Wanted.STRING)
            values.append((variable.name, program))
        return SetVariables(tuple(values))

    def variable_name(self, path: str, name: str) -> None:
        self.limits.check_name("rule variable", name)
        if not is_variable_name(name):
            raise invalid(
                self.name,
                f'{path}: invalid variable name "{name}" (must match /^[a-z][a-z0-9_]*$/)',
            )

    def expression(
        self, path: str, source: str, wanted: Wanted, item: str | None = None
    ) -> Program:
        limits = self.limits
        self.expressions += 1
        if self.expressions > limits.max_rule_expressions:
            raise invalid(
                self.name,
                f"more than {limits.max_rule_expressions} expressions"
                " (limits.max_rule_expressions)",
            )
        size = len(source.encode())
        if size > limits.max_rule_expression_bytes:
            raise invalid(
                self.name,
                f"{path}: the expression is {size} bytes, over the limit of"
                f" {limits.max_rule_expression_bytes} (limits.max_rule_expression_bytes)",
            )
        if not source.strip():
            raise invalid(self.name, f"{path}: the expression is empty")
        try:
            return self.environment.compile(path, source, wanted, item)
        except CelRefusal as error:
            raise invalid(self.name, str(error)) from None


def _failure_policy(value: int) -> FailurePolicy:
    """The wire's policy; an unset one is FAIL, as for callbacks."""
    return FailurePolicy.IGNORE if value == pb.FAILURE_POLICY_IGNORE else FailurePolicy.FAIL


def _programs(mutations: tuple[Mutation, ...]) -> list[Program]:
    programs: list[Program] = []
    for mutation in mutations:
        if isinstance(mutation, Filter):
            programs.append(mutation.predicate)
        elif isinstance(mutation, Upsert):
            programs.extend(text for _, _, text in mutation.parts)
        elif isinstance(mutation, SetVariables):
            programs.extend(value for _, value in mutation.values if value is not None)
    return programs


def _cost(program: Program, items: int) -> int:
    """One program's worst case in one application: a predicate's over every item."""
    return over_items(program.cost, items) if program.over_items else program.cost
