"""A rule applied to one assembly: its match, then its mutations in order, on a copy; a run-time
failure is RULE_FAILED naming the rule and the expression (the waterfall applies the rule's
failure policy to it)."""

from __future__ import annotations

import asyncio
import json
import math
from collections import OrderedDict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason

from ..errors import RegistryError, Status
from ..limits import Limits
from ..model import Assembly, Part, Tool
from .compiled import Filter, Rule, SetVariables, ToolOrder, Upsert
from .cost import over_items
from .environment import CelFailure, Program, chunked, evaluate

T = TypeVar("T")
# Estimated units (about a nanosecond each) a rule may run before it lets others have the loop.
YIELD_UNITS = 1_000_000
_TOOLS_KEPT = 4096  # tool messages kept converted: tools are shared, immutable values


def failed(rule: str, path: str, why: str) -> RegistryError:
    """RULE_FAILED, naming the rule and the expression."""
    return RegistryError(Status.ABORTED, Reason.RULE_FAILED, f'rule "{rule}" failed: {path}: {why}')


@dataclass(slots=True)
class Inputs:
    """What the rules of one assembly read besides the assembly, made once for all of them:
    the fields parsed, the scope and its chain, and each part's order (a registered part's,
    and a rule's new part's) for placing new parts."""

    fields_json: str
    scope: str
    chain: list[str]
    limits: Limits
    orders: dict[str, dict[str, float]]  # "sections" / "contexts": name -> order
    _fields: dict[str, Any] | None = None
    _converted: tuple[Assembly, pb.PromptAssembly] | None = field(default=None)

    def fields(self, rule: str) -> dict[str, Any]:
        limit = self.limits.max_rule_fields_bytes
        if len(self.fields_json) > limit:  # its cost was bounded for no more (cost.py)
            raise failed(
                rule,
                "fields",
                f"the assemble context's fields are {len(self.fields_json)} bytes, over the"
                f" {limit} its rules are checked for (limits.max_rule_fields_bytes)",
            )
        if self._fields is None:
            try:
                parsed = json.loads(self.fields_json) if self.fields_json else {}
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                raise failed(rule, "fields", "the assemble context's fields_json is not an object")
            self._fields = parsed
        return self._fields

    def proto(self, assembly: Assembly) -> pb.PromptAssembly:
        """`assembly` as the proto's message (kept while the next rule gets the same one)."""
        if self._converted is None or self._converted[0] is not assembly:
            self._converted = (assembly, assembly_message(assembly))
        return self._converted[1]


def apply(rule: Rule, assembly: Assembly, inputs: Inputs) -> Assembly:
    """The assembly after `rule`: `assembly` itself when a match is false, else a new one
    (`assembly` is never changed). Raises RULE_FAILED."""
    steps = _applying(rule, assembly, inputs)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        result: Assembly = done.value
        return result


async def apply_yielding(rule: Rule, assembly: Assembly, inputs: Inputs) -> Assembly:
    """As `apply`, handing the event loop to the other callers between evaluations once
    `YIELD_UNITS` of estimated work ran since it last did: the library cannot be interrupted
    (it holds the GIL), so what others wait for is one evaluation, bounded at registration
    (limits.max_rule_evaluation_cost), not the whole rule."""
    steps = _applying(rule, assembly, inputs)
    spent = 0
    try:
        while True:
            cost = next(steps)  # the next evaluation's, before it runs
            if spent and spent + cost > YIELD_UNITS:
                await asyncio.sleep(0)
                spent = 0
            spent += cost
    except StopIteration as done:
        result: Assembly = done.value
        return result


Steps = Generator[int, None, T]


def _applying(rule: Rule, assembly: Assembly, inputs: Inputs) -> Steps[Assembly]:
    """`apply`'s work, yielding each evaluation's estimated cost before it runs."""
    _check_sizes(rule, assembly, inputs.limits)
    run = _Run(rule, assembly, inputs)
    for program in rule.match:
        if not (yield from run.value(program)):
            return assembly
    result = assembly.copy()
    for mutation in rule.mutations:
        if isinstance(mutation, Filter):
            yield from _filter(run, result, mutation)
        elif isinstance(mutation, ToolOrder):
            result.tools = _ordered(result.tools, mutation.names)
        elif isinstance(mutation, Upsert):
            yield from _upsert(run, result, mutation, inputs)
        else:
            yield from _set(run, result, mutation)
    return result


def _check_sizes(rule: Rule, assembly: Assembly, limits: Limits) -> None:
    """A rule's cost was bounded for lists of at most `max_rule_items` (cost.py): an assembly
    with more fails the rule, which might otherwise run far longer than it was admitted for."""
    if not rule.reads_items:
        return
    for what in ("tools", "sections", "contexts", "variables"):
        count = len(getattr(assembly, what))
        if count > limits.max_rule_items:
            raise failed(
                rule.name,
                "assembly",
                f"the assembly has {count} {what}, over the {limits.max_rule_items} its rules"
                " are checked for (limits.max_rule_items)",
            )


class _Run:
    """One rule's evaluations on one assembly: the bindings, and its variables evaluated at
    most once each, when an expression naming them first runs."""

    def __init__(self, rule: Rule, assembly: Assembly, inputs: Inputs) -> None:
        self.rule = rule
        self.data: dict[str, Any] = {
            "fields": inputs.fields(rule.name),
            "scope": inputs.scope,
            "scope_chain": inputs.chain,
        }
        if rule.reads_assembly:
            self.data["assembly"] = inputs.proto(assembly)
        self.variables: dict[str, Any] = {}  # those evaluated so far
        self.data["variables"] = {}
        self._activation: Any = None

    def value(self, program: Program, items: list[Any] | None = None) -> Steps[Any]:
        """The program's value (a predicate's verdicts over `items`), its evaluation's cost
        (for the items there are) yielded before it runs."""
        for name in program.variables:
            if name not in self.variables:
                self.variables[name] = yield from self.value(self.rule.variables[name])
                self.data["variables"] = dict(self.variables)
                self._activation = None
        if items is None:
            if self._activation is None:
                self._activation = self.rule.environment.activation(self.data)
            yield program.cost
            return self._evaluated(program, self._activation)
        self.data["items_"] = chunked(items)
        self._activation = self.rule.environment.activation(self.data)
        yield over_items(program.cost, len(items))
        return self._evaluated(program, self._activation)

    def _evaluated(self, program: Program, activation: Any) -> Any:
        try:
            return evaluate(program, activation)
        except CelFailure as error:
            raise failed(self.rule.name, program.path, str(error)) from None


def _filter(run: _Run, result: Assembly, mutation: Filter) -> Steps[None]:
    if mutation.items == "tools":
        tools = result.tools
        messages = [_tool_message(tool) for tool in tools]
        verdicts = yield from run.value(mutation.predicate, messages)
        result.tools = [t for t, v in zip(tools, verdicts, strict=True) if v is mutation.keep]
        return
    parts: list[Part] = getattr(result, mutation.items)
    message = pb.AssembledSection if mutation.items == "sections" else pb.AssembledContext
    items = [message(name=part.name, text=part.text) for part in parts]
    verdicts = yield from run.value(mutation.predicate, items)
    kept = [part for part, verdict in zip(parts, verdicts, strict=True) if not verdict]
    setattr(result, mutation.items, kept)


def _ordered(tools: list[Tool], names: tuple[str, ...]) -> list[Tool]:
    """The named tools first, in the order named (absent ones passed over), then the rest."""
    by_name = {tool.name: tool for tool in tools}
    first = [by_name[name] for name in names if name in by_name]
    listed = set(names)
    return first + [tool for tool in tools if tool.name not in listed]


def _upsert(run: _Run, result: Assembly, mutation: Upsert, inputs: Inputs) -> Steps[None]:
    parts: list[Part] = getattr(result, mutation.parts_of)
    orders = inputs.orders.setdefault(mutation.parts_of, {})
    for name, order, program in mutation.parts:
        text = yield from run.value(program)
        try:
            inputs.limits.check_text(f'the text of "{name}"', text)
        except RegistryError as error:
            raise failed(run.rule.name, program.path, error.message) from None
        index = next((i for i, part in enumerate(parts) if part.name == name), None)
        if index is not None:  # a part of that name keeps its place: only its text changes
            parts[index] = Part(name, text)
            continue
        parts.insert(_place(parts, orders, order), Part(name, text))
        orders[name] = order


def _place(parts: list[Part], orders: dict[str, float], order: float) -> int:
    """Where a new part of `order` goes: after every part whose order is at most `order`; a
    part with no order of its own (a listener's) has the order of the part before it."""
    position = 0
    current = -math.inf
    for index, part in enumerate(parts):
        current = orders.get(part.name, current)
        if current <= order:
            position = index + 1
    return position


def _set(run: _Run, result: Assembly, mutation: SetVariables) -> Steps[None]:
    for name, program in mutation.values:
        value = None if program is None else (yield from run.value(program))
        result.variables[name] = value


_tool_messages: OrderedDict[Tool, pb.ToolSchema] = OrderedDict()


def _tool_message(tool: Tool) -> pb.ToolSchema:
    """A tool as the proto's message, converted once while it is among the recent ones."""
    message = _tool_messages.get(tool)
    if message is None:
        message = pb.ToolSchema(
            name=tool.name, description=tool.description, parameters_json=tool.parameters_json
        )
        _tool_messages[tool] = message
        if len(_tool_messages) > _TOOLS_KEPT:
            _tool_messages.popitem(last=False)
    return message


def assembly_message(assembly: Assembly) -> pb.PromptAssembly:
    """The assembly as the environment's `assembly` sees it."""
    message = pb.PromptAssembly(
        sections=[pb.AssembledSection(name=p.name, text=p.text) for p in assembly.sections],
        contexts=[pb.AssembledContext(name=p.name, text=p.text) for p in assembly.contexts],
    )
    message.tools.extend(_tool_message(tool) for tool in assembly.tools)
    for name, value in assembly.variables.items():
        variable = message.variables.add(name=name)
        if value is not None:
            variable.value = value
    return message
