"""A rule applied to one assembly: its match, then its mutations in order, on a new assembly that
shares the lists no mutation changes (the input is never changed); a run-time failure is
RULE_FAILED naming the rule and the expression (the waterfall applies the rule's failure policy
to it)."""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason
from google.protobuf.message import Message

from ..errors import RegistryError, Status
from ..limits import Limits
from ..model import Assembly, Part, Tool
from .compiled import Filter, Rule, SetVariables, ToolOrder, Upsert
from .cost import over_items
from .environment import ITEMS_LIST, CelFailure, Environment, Program, chunked, evaluate

T = TypeVar("T")
# Estimated units (about a nanosecond each) a rule may run before it lets others have the loop.
YIELD_UNITS = 1_000_000
_ITEMS_BYTES = 4 * 1024 * 1024  # messages kept converted, of each kind, with their items


def failed(rule: str, path: str, why: str) -> RegistryError:
    """RULE_FAILED, naming the rule and the expression."""
    return RegistryError(Status.ABORTED, Reason.RULE_FAILED, f'rule "{rule}" failed: {path}: {why}')


@dataclass(slots=True)
class Inputs:
    """What the rules of one assembly read besides the assembly, made once for all of them:
    the fields parsed, the scope and its chain, their bindings, and each part's order (a
    registered part's, and a rule's new part's) for placing new parts."""

    fields_json: str
    scope: str
    chain: list[str]
    limits: Limits
    # "sections" / "contexts": name -> order, read only (a plan's, shared by its assemblies)
    orders: dict[str, dict[str, float]]
    _fields: dict[str, Any] | None = None
    _converted: tuple[Assembly, pb.PromptAssembly] | None = field(default=None)
    _data: dict[str, Any] | None = None  # the bindings every rule's evaluations share
    _activation: Any = None  # `_data` converted, for the rules that bind nothing of their own
    _own_orders: dict[str, dict[str, float]] = field(default_factory=dict)

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

    def data(self, rule: str) -> dict[str, Any]:
        """The bindings every rule's evaluations share (not to be changed: copy it to add)."""
        fields = self.fields(rule)  # checked for each rule: each fails naming itself
        if self._data is None:
            self._data = {
                "fields": fields,
                "scope": self.scope,
                "scope_chain": self.chain,
                "variables": {},
            }
        return self._data

    def activation(self, environment: Environment, rule: str) -> Any:
        """`data()` converted once for the rules of this assembly that bind nothing more."""
        data = self.data(rule)
        if self._activation is None:
            self._activation = environment.activation(data)
        return self._activation

    def own_orders(self, parts_of: str) -> dict[str, float]:
        """The orders of `parts_of` ("sections" or "contexts") that a rule's new part joins:
        the plan's, copied at this assembly's first new part."""
        own = self._own_orders.get(parts_of)
        if own is None:
            own = self._own_orders[parts_of] = dict(self.orders.get(parts_of, {}))
        return own

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
    (limits.max_rule_evaluation_cost), not the whole rule.

    The rule then waits as long as that slice of its work took (HANDOVER_S at least), on a
    timer: with nothing else to run the loop's thread sleeps, and a rule that hands over
    takes at most about half of it. Handing over with `sleep(0)` gave the loop back at
    once: the thread never slept while the rule ran, and other callers' Assembles beside
    the dearest admitted rule took 3.3 times their calm p99 (6 to 12 times with the host
    loaded); gRPC's poller thread, which hands the loop each request and each completion,
    and the clients on the host need the CPU it held."""
    steps = _applying(rule, assembly, inputs)
    spent = 0
    since = time.perf_counter()
    try:
        while True:
            cost = next(steps)  # the next evaluation's, before it runs
            if spent and spent + cost > YIELD_UNITS:
                await asyncio.sleep(max(HANDOVER_S, time.perf_counter() - since))
                spent, since = 0, time.perf_counter()
            spent += cost
    except StopIteration as done:
        result: Assembly = done.value
        return result


HANDOVER_S = 100e-6  # the shortest wait of a rule that hands the loop over


Steps = Generator[int, None, T]


def _applying(rule: Rule, assembly: Assembly, inputs: Inputs) -> Steps[Assembly]:
    """`apply`'s work, yielding each evaluation's estimated cost before it runs."""
    _check_sizes(rule, assembly, inputs.limits)
    run = _Run(rule, assembly, inputs)
    for program in rule.match:
        if not (yield from run.value(program)):
            return assembly
    # the lists are shared until a mutation changes one: it makes its own (copy on write)
    result = Assembly(assembly.sections, assembly.contexts, assembly.tools, assembly.variables)
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
        self.inputs = inputs
        self.data = inputs.data(rule.name)
        # a rule that reads the assembly or has variables binds them: bindings of its own
        self.own = rule.reads_assembly or bool(rule.variables)
        if rule.reads_assembly:
            self.data = {**self.data, "assembly": inputs.proto(assembly)}
        self.variables: dict[str, Any] = {}  # those evaluated so far
        self._activation: Any = None

    def value(self, program: Program, items: list[Any] | None = None) -> Steps[Any]:
        """The program's value (a predicate's verdicts over `items`), its evaluation's cost
        (for the items there are) yielded before it runs."""
        for name in program.variables:
            if name not in self.variables:
                self.variables[name] = yield from self.value(self.rule.variables[name])
                self.data = {**self.data, "variables": dict(self.variables)}
                self._activation = None
        environment = self.rule.environment
        if items is not None:
            activation = environment.activation({**self.data, ITEMS_LIST: chunked(items)})
            yield over_items(program.cost, len(items))
            return self._evaluated(program, activation)
        if not self.own:
            activation = self.inputs.activation(environment, self.rule.name)
        elif self._activation is None:
            activation = self._activation = environment.activation(self.data)
        else:
            activation = self._activation
        yield program.cost
        return self._evaluated(program, activation)

    def _evaluated(self, program: Program, activation: Any) -> Any:
        try:
            return evaluate(program, activation)
        except CelFailure as error:
            raise failed(self.rule.name, program.path, str(error)) from None


def _filter(run: _Run, result: Assembly, mutation: Filter) -> Steps[None]:
    items: list[Any] = getattr(result, mutation.items)
    verdicts = yield from run.value(mutation.predicate, _MESSAGES[mutation.items].of(items))
    # a drop keeps those judged false, keep_tools those judged true
    kept = [item for item, verdict in zip(items, verdicts, strict=True) if verdict is mutation.keep]
    setattr(result, mutation.items, kept)


def _ordered(tools: list[Tool], names: tuple[str, ...]) -> list[Tool]:
    """The named tools first, in the order named (absent ones passed over), then the rest."""
    by_name = {tool.name: tool for tool in tools}
    first = [by_name[name] for name in names if name in by_name]
    listed = set(names)
    return first + [tool for tool in tools if tool.name not in listed]


def _upsert(run: _Run, result: Assembly, mutation: Upsert, inputs: Inputs) -> Steps[None]:
    parts: list[Part] = list(getattr(result, mutation.parts_of))  # its own: it changes them
    setattr(result, mutation.parts_of, parts)
    for name, order, program in mutation.parts:
        text = yield from run.value(program)
        try:
            inputs.limits.check_text(f'the text of "{name}"', text)
        except RegistryError as error:
            raise failed(run.rule.name, program.path, error.message) from None
        names = list(map(_NAME, parts))
        if name in names:  # a part of that name keeps its place: only its text changes
            parts[names.index(name)] = Part(name, text)
            continue
        orders = inputs.own_orders(mutation.parts_of)
        parts.insert(_place(names, orders, order), Part(name, text))
        orders[name] = order


def _place(names: list[str], orders: dict[str, float], order: float) -> int:
    """Where a new part of `order` goes: after every part whose order is at most `order`; a
    part with no order of its own (a listener's) has the order of the part before it. Read
    from the end, where a new part most often goes: each part with an order of its own
    starts a run of parts of that order, up to the next one's."""
    owns = list(map(orders.get, names))
    position = len(owns)  # where the run after the one looked at starts
    for index in range(len(owns) - 1, -1, -1):
        own = owns[index]
        if own is None:
            continue
        if own <= order:
            return position  # after the whole run
        position = index
    return position  # the parts before any with an order of their own: the lowest order


def _set(run: _Run, result: Assembly, mutation: SetVariables) -> Steps[None]:
    result.variables = dict(result.variables)  # its own: it changes them
    for name, program in mutation.values:
        value = None if program is None else (yield from run.value(program))
        result.variables[name] = value


_NAME = operator.attrgetter("name")


class _Messages:
    """Tools, sections or contexts as the proto's messages, converted once while they are
    among the last ones, `max_bytes` at most together (a part's strings, and the message's
    copy of them): found by the object's id (hashing a Tool or Part by value runs Python
    code, about half a microsecond: 40 tools judged by 3 rules took 60 us), each kept with
    the object so that its id is not reused while it is kept."""

    def __init__(self, convert: Callable[[Any], Message], max_bytes: int = _ITEMS_BYTES) -> None:
        self._convert = convert
        self._max_bytes = max_bytes
        self._bytes = 0
        self._by_id: dict[int, tuple[object, Message, int]] = {}

    def of(self, items: list[Any]) -> list[Any]:
        """`items` as messages."""
        by_id = self._by_id
        found = list(map(by_id.get, map(id, items)))
        if None in found:
            for index in itertools.compress(range(len(found)), map(operator.not_, found)):
                item = items[index]
                size = 2 * sum(map(sys.getsizeof, _held_strings(item)))
                found[index] = entry = (item, self._convert(item), size)
                if size <= self._max_bytes:
                    by_id[id(item)] = entry
                    self._bytes += size
            while self._bytes > self._max_bytes:
                self._bytes -= by_id.pop(next(iter(by_id)))[2]  # the oldest first
        return list(map(operator.itemgetter(1), found))  # type: ignore[arg-type]


def _held_strings(item: Tool | Part) -> tuple[str, ...]:
    if isinstance(item, Tool):
        return (item.name, item.description, item.parameters_json)
    return (item.name, item.text)


_MESSAGES = {
    "tools": _Messages(
        lambda tool: pb.ToolSchema(
            name=tool.name, description=tool.description, parameters_json=tool.parameters_json
        )
    ),
    "sections": _Messages(lambda part: pb.AssembledSection(name=part.name, text=part.text)),
    "contexts": _Messages(lambda part: pb.AssembledContext(name=part.name, text=part.text)),
}


def assembly_message(assembly: Assembly) -> pb.PromptAssembly:
    """The assembly as the environment's `assembly` sees it."""
    message = pb.PromptAssembly(
        sections=_MESSAGES["sections"].of(assembly.sections),
        contexts=_MESSAGES["contexts"].of(assembly.contexts),
        tools=_MESSAGES["tools"].of(assembly.tools),
    )
    for name, value in assembly.variables.items():
        variable = message.variables.add(name=name)
        if value is not None:
            variable.value = value
    return message
