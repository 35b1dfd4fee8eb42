"""One assembly, step by step (contract.md section 2), on a snapshot plan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dsh_system_prompt_core import TOOL_ORDER_REST, Reason

from .. import errors
from ..callbacks.cache import MISSING, CallbackCache
from ..callbacks.ejection import Budget
from ..limits import Limits
from ..model import (
    AssembleContext,
    Assembly,
    CachePolicy,
    ContextRegistration,
    Dynamic,
    ListenerRegistration,
    Part,
    ProvidedValue,
    ProviderCall,
    ProviderHost,
    SectionRegistration,
    Tool,
    ToolSet,
    ToolsRegistration,
    ValueRegistration,
    VariableRegistration,
)
from ..provenance import Origins, PartKind, Trace
from .invariants import validate
from .origins import entry_origin, record_changes, snapshot
from .plan import Plan
from .tool_order import check_known, order_tools

# Seconds left to answer, or None without a limit; asked anew at every call.
Timeout = Budget  # each callback's time, asked anew at every call; told how each did


async def run(
    plan: Plan,
    context: AssembleContext,
    tool_order: Sequence[str] | None,
    limits: Limits,
    timeout: Timeout,
    track: bool = False,
    callbacks: CallbackCache | None = None,
) -> Assembly:
    """Evaluate, order, run the waterfall, enforce and validate (a fresh assembly).

    With `track`, the assembly's `origins` say where each part came from (and no
    cached callback answer is used: each is asked). With `callbacks`, the answers
    of callbacks that declared a cache policy are reused from there and kept there.
    """
    if track:
        return await _run(plan, context, tool_order, limits, timeout, {})
    if plan.result is None:
        result = await _run(plan, context, tool_order, limits, timeout, None, callbacks)
        if not plan.is_static:
            return result
        plan.result = result
    return plan.result.copy()


async def _run(
    plan: Plan,
    context: AssembleContext,
    tool_order: Sequence[str] | None,
    limits: Limits,
    timeout: Timeout,
    origins: Origins | None = None,
    callbacks: CallbackCache | None = None,
) -> Assembly:
    complete = plan.complete_section()
    cached = None if callbacks is None else _Cached(callbacks=callbacks, plan=plan, context=context)
    values = await _evaluate(plan, context, timeout, cached)
    _check_provided(values, limits)
    sections = [Part(name=e.name, text=_text(e, values)) for e in plan.sections]
    tools = _collect_tools(plan.tools, values, tool_order)
    assembly = Assembly(
        sections=sections,
        contexts=[Part(name=e.name, text=_text(e, values)) for e in plan.contexts],
        tools=tools,
        variables={e.name: _variable(e, values) for e in plan.variables},
    )
    trace = None
    if origins is not None:
        origins.update(_registered_origins(plan, values))
        trace = Trace(chain=tuple(plan.chain))
        trace.record("", snapshot(assembly))
    result = await _waterfall(plan.listeners, assembly, context, timeout, origins, trace, cached)
    if complete is not None:
        result.sections = [Part(name=complete.name, text=_text(complete, values))]
        if origins is not None:
            origins[(PartKind.SECTION, complete.name)] = entry_origin(complete, plan.chain)
    if plan.suppressed:
        result.contexts = []
    validate(result)
    if origins is not None:
        result.origins = dict(origins)
        result.trace = trace
    return result


def _registered_origins(plan: Plan, values: Mapping[ValueRegistration, ProvidedValue]) -> Origins:
    origins: Origins = {}
    for kind, entries in (
        (PartKind.VARIABLE, plan.variables),
        (PartKind.SECTION, plan.sections),
        (PartKind.CONTEXT, plan.contexts),
    ):
        for entry in entries:
            origins[(kind, entry.name)] = entry_origin(entry, plan.chain)
    for provider in plan.tools:
        if isinstance(source := _resolved(provider, values), ToolSet):
            for tool in source.schemas:
                origins[(PartKind.TOOL, tool.name)] = entry_origin(provider, plan.chain)
    return origins


def _dynamic_calls(
    plan: Plan, answered: Mapping[ValueRegistration, ProvidedValue]
) -> dict[ProviderHost, list[tuple[ValueRegistration, ProviderCall]]]:
    calls: dict[ProviderHost, list[tuple[ValueRegistration, ProviderCall]]] = {}
    for entry, value in plan.dynamic:
        if not entry.disposed and entry not in answered:
            calls.setdefault(value.host, []).append((entry, entry.provider_call(value.key)))
    return calls


@dataclass(slots=True)
class _Cached:
    """The callback cache as one assembly uses it: at its plan's revision, and
    keeping only what no invalidation overtook while the assembly ran."""

    callbacks: CallbackCache
    plan: Plan
    context: AssembleContext
    generation: int = field(init=False)

    def __post_init__(self) -> None:
        self.generation = self.callbacks.generation

    def answers(self, values: dict[ValueRegistration, ProvidedValue]) -> None:
        """Fill `values` with the kept answers of cacheable providers."""
        for entry, value in self.plan.dynamic:
            if value.cache is not None:
                answer = self.callbacks.answer(
                    entry.id, value.cache, self.context, self.plan.revision
                )
                if answer is not MISSING:
                    values[entry] = answer  # type: ignore[assignment]

    def keep_answer(self, entry: ValueRegistration, answer: ProvidedValue) -> None:
        policy = entry.value.cache if isinstance(entry.value, Dynamic) else None
        if policy is not None:
            self.callbacks.keep_answer(
                entry.id, policy, self.context, self.plan.revision, self.generation, answer
            )

    def tail_key(self) -> tuple[tuple[str, ...], CachePolicy] | None:
        policy = self.plan.tail_policy
        if policy is None:
            return None
        return tuple(entry.id for entry in self.plan.cacheable_tail), policy

    def result(self, given: Assembly) -> Assembly | None:
        key = self.tail_key()
        if key is None:
            return None
        ids, policy = key
        return self.callbacks.result(ids, policy, self.context, self.plan.revision, given)

    def keep_result(self, given: Assembly, result: Assembly) -> None:
        key = self.tail_key()
        if key is not None:
            ids, policy = key
            self.callbacks.keep_result(
                ids, policy, self.context, self.plan.revision, self.generation, given, result
            )


async def _evaluate(
    plan: Plan, context: AssembleContext, timeout: Timeout, cached: _Cached | None = None
) -> dict[ValueRegistration, ProvidedValue]:
    """Ask each host once, all hosts at the same time; the first failure wins.
    Providers whose answer is cached are not asked."""
    values: dict[ValueRegistration, ProvidedValue] = {}
    if cached is not None:
        cached.answers(values)
    by_host = _dynamic_calls(plan, values)
    if not by_host:
        return values
    tasks = {}
    for host, pairs in by_host.items():
        given = timeout(_own_timeout(pairs))
        calls = [call for _, call in pairs]
        tasks[asyncio.ensure_future(host.provide(calls, context, given))] = (pairs, given)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            _judge(task, *tasks[task], timeout)
        for task in done:
            task.result()  # raise the first failure
    finally:
        for task in tasks:
            task.cancel()
    for task, (pairs, _) in tasks.items():
        answers: Mapping[str, ProvidedValue] = task.result()
        for entry, call in pairs:
            values[entry] = answers[call.key]
            if cached is not None:
                cached.keep_answer(entry, answers[call.key])
    return values


def _own_timeout(pairs: Sequence[tuple[ValueRegistration, ProviderCall]]) -> float | None:
    """The time one exchange with a host may take: the longest its providers declared."""
    owns = [e.value.timeout_s for e, _ in pairs if isinstance(e.value, Dynamic)]
    declared = [own for own in owns if own is not None]
    return max(declared) if declared else None


def _judge(
    task: asyncio.Future[Mapping[str, ProvidedValue]],
    pairs: Sequence[tuple[ValueRegistration, ProviderCall]],
    given: float,
    timeout: Timeout,
) -> None:
    """Tell the budget how a host's providers did (a timeout may eject them)."""
    error = None if task.cancelled() else task.exception()
    own = _own_timeout(pairs)
    for entry, _ in pairs:
        if isinstance(error, errors.Failure):
            timeout.failed(entry, error, given, own)
        elif error is None:
            timeout.answered(entry)


def _check_provided(values: Mapping[ValueRegistration, ProvidedValue], limits: Limits) -> None:
    """Provided values obey the limits registered ones do."""
    for entry, value in values.items():
        try:
            if isinstance(value, str):
                limits.check_text("its answer", value)
            elif isinstance(value, ToolSet):
                limits.check_tools(value)
        except errors.RegistryError as error:
            call = entry.provider_call("")
            raise errors.RegistryError(
                errors.Status.ABORTED, Reason.PROVIDER_FAILED, f"{call.describe()} failed: {error}"
            ) from None


def _resolved(
    entry: ValueRegistration, values: Mapping[ValueRegistration, ProvidedValue]
) -> object:
    """The entry's value in this assembly: as registered, or as its provider answered
    (None when it was not asked: disposed while the assembly ran)."""
    return values.get(entry) if isinstance(entry.value, Dynamic) else entry.value


def _text(
    entry: SectionRegistration | ContextRegistration,
    values: Mapping[ValueRegistration, ProvidedValue],
) -> str:
    text = _resolved(entry, values)
    return text if isinstance(text, str) else ""


def _variable(
    entry: VariableRegistration, values: Mapping[ValueRegistration, ProvidedValue]
) -> str | None:
    value = _resolved(entry, values)
    return value if isinstance(value, str) else None


def _collect_tools(
    providers: list[ToolsRegistration],
    values: Mapping[ValueRegistration, ProvidedValue],
    tool_order: Sequence[str] | None,
) -> list[Tool]:
    collected: list[Tool] = []
    known: list[str] = []
    for entry in providers:
        source = _resolved(entry, values)
        if not isinstance(source, ToolSet):
            continue  # disposed before it was asked
        collected.extend(source.schemas)
        known.extend(source.known())
    if any(tool.name == TOOL_ORDER_REST for tool in collected):
        raise errors.reserved_tool_name(TOOL_ORDER_REST)
    if tool_order is not None:
        check_known(tool_order, known)
    return order_tools(collected, tool_order)


_FLAT_EVERY = 16  # listeners whose next() nest their frames before a task flattens them


async def _waterfall(
    listeners: list[ListenerRegistration],
    assembly: Assembly,
    context: AssembleContext,
    timeout: Timeout,
    origins: Origins | None,
    trace: Trace | None = None,
    cached: _Cached | None = None,
) -> Assembly:
    tail = len(listeners) - len(cached.plan.cacheable_tail) if cached is not None else -1

    async def step(index: int, current: Assembly) -> Assembly:
        if index == tail and tail < len(listeners) and cached is not None:
            return await cached_tail(index, current, cached)
        while index < len(listeners) and listeners[index].disposed:
            index += 1  # disposed while the assembly ran: skipped
        if index == len(listeners):
            return current
        listener = listeners[index]
        from_next: list[Assembly] = []
        passed_on: list[errors.Failure] = []

        async def next_(handed: Assembly) -> Assembly:
            if origins is not None:  # what the listener changed before next()
                record_changes(origins, current, handed, listener.name)
            if trace is not None:
                trace.record(listener.name, snapshot(handed))
            rest = step(index + 1, handed)
            # Awaited in place (no task to hand over to), but every _FLAT_EVERY listeners
            # in a task of its own, whose frames do not nest: 1,000 listeners stay in bounds.
            flat = (index + 1) % _FLAT_EVERY == 0
            try:
                returned = await (asyncio.ensure_future(rest) if flat else rest)
            except errors.Failure as error:
                passed_on.append(error)  # the rest of the chain failed: not this listener
                raise
            from_next.append(returned)
            return returned

        own = listener.timeout_s
        given = timeout(own)
        try:
            result = await listener.value.invoke(current, context, next_, given)
        except errors.Failure as error:
            if not any(passed is error for passed in passed_on):  # its own, not the rest's
                timeout.failed(listener, error, given, own)
            raise
        timeout.answered(listener)
        if origins is not None:  # what it changed after next(), or instead of it
            record_changes(origins, from_next[0] if from_next else current, result, listener.name)
        if trace is not None:
            trace.record(listener.name, snapshot(result))
        return result

    async def cached_tail(index: int, given: Assembly, cached: _Cached) -> Assembly:
        """The cacheable tail of the waterfall: its kept result for this input, or
        run it (as from the tail's first listener on) and keep what it returns."""
        kept = cached.result(given)
        if kept is not None:
            return kept
        nonlocal tail
        tail = -1  # run the tail itself, once
        result = await step(index, given)
        cached.keep_result(given, result)
        return result

    return await step(0, assembly)
