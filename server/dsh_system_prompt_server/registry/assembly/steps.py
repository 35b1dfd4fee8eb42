"""One assembly, step by step (contract.md section 2), on a snapshot plan."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from dsh_system_prompt_core import Reason

from .. import errors
from ..callbacks import MISSING, Budget, CallbackCache
from ..limits import Limits
from ..model import (
    AssembleContext,
    Assembly,
    CachePolicy,
    Dynamic,
    Exchange,
    FailurePolicy,
    ListenerRegistration,
    Part,
    ProvidedValue,
    ProviderCall,
    ProviderHost,
    RuleRegistration,
    StepRegistration,
    ToolSet,
    ValueRegistration,
)
from ..provenance import Origins, PartKind, Trace
from ..rules import Inputs
from .invariants import validate
from .origins import entry_origin, record_changes, snapshot, step_origin
from .plan import Plan
from .prelude import part_text, prelude, resolved
from .rule_steps import rule_inputs, run_rule

R = TypeVar("R")

# Seconds left to answer, or None without a limit; asked anew at every call.
Timeout = Budget  # each callback's time, asked anew at every call; told how each did


async def assemble_plan(
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
    assembly = plan.result.copy()
    assembly.skipped = plan.result.skipped  # those out of reach, at each assembly of the plan
    return assembly


async def _run(
    plan: Plan,
    context: AssembleContext,
    tool_order: Sequence[str] | None,
    limits: Limits,
    timeout: Timeout,
    origins: Origins | None = None,
    callbacks: CallbackCache | None = None,
) -> Assembly:
    timeout.skips.steps.extend(plan.out_of_reach)  # passed over first: never run here
    complete = plan.complete_section()
    cached = None if callbacks is None else _Cached(callbacks=callbacks, plan=plan, context=context)
    values = await _evaluate(plan, context, timeout, cached)
    _check_provided(values, limits, timeout)
    left_out = {skipped.registration_id for skipped in timeout.skips.steps}
    if complete is not None and complete.id in left_out:
        complete = None  # skipped: the sections stand as if it were not registered
    # the same at every assembly of the plan (a static plan keeps its whole result instead)
    kept = bool(plan.listeners) and not plan.dynamic and origins is None
    if not kept or plan.prelude is None:
        assembly = prelude(plan, values, tool_order, left_out)
        if kept:
            plan.prelude = assembly
    else:
        assembly = plan.prelude
    trace = None
    if origins is not None:
        origins.update(_registered_origins(plan, values))
        trace = Trace(chain=tuple(plan.chain))
        trace.record(snapshot(assembly))
    inputs = rule_inputs(plan, context, limits)
    if plan.rules_only and inputs is not None:  # no listener: none of its machinery
        result = await _rules(plan.listeners, assembly, inputs, timeout, origins, trace)
    else:
        result = await _waterfall(
            plan.listeners, assembly, context, timeout, origins, trace, cached, inputs
        )
    if result is plan.prelude:  # no step changed it: the kept one is not the caller's
        result = result.copy()
    if complete is not None:
        result.sections = [Part(name=complete.name, text=part_text(complete, values))]
        if origins is not None:
            origins[(PartKind.SECTION, complete.name)] = entry_origin(complete, plan.chain)
    if plan.suppressed:
        result.contexts = []
    validate(result)
    if origins is not None:
        result.origins = dict(origins)
        result.trace = trace
    result.skipped = tuple(timeout.skips.steps)
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
        if isinstance(source := resolved(provider, values), ToolSet):
            for tool in source.schemas:
                origins[(PartKind.TOOL, tool.name)] = entry_origin(provider, plan.chain)
    return origins


def _dynamic_calls(
    plan: Plan, answered: Mapping[ValueRegistration, ProvidedValue]
) -> dict[tuple[ProviderHost, FailurePolicy], list[tuple[ValueRegistration, ProviderCall]]]:
    """The calls each host is asked, in one exchange per host and failure policy: a slow
    provider under IGNORE does not hold up (or time out) those of its session under FAIL."""
    calls: dict[
        tuple[ProviderHost, FailurePolicy], list[tuple[ValueRegistration, ProviderCall]]
    ] = {}
    for entry, value in plan.dynamic:
        if not entry.disposed and entry not in answered:
            exchange = calls.setdefault((value.host, value.failure_policy), [])
            exchange.append((entry, entry.provider_call(value.key)))
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
    """Ask each host once (per failure policy), all hosts at the same time; the first
    failure wins, but a provider under IGNORE that fails is skipped. Providers whose answer
    is cached are not asked."""
    values: dict[ValueRegistration, ProvidedValue] = {}
    if cached is not None:
        cached.answers(values)
    by_host = _dynamic_calls(plan, values)
    if not by_host:
        return values
    if len(by_host) == 1:  # one host: asked from this task, with no task of its own to wake
        [((host, _), pairs)] = by_host.items()
        exchange = _exchange(pairs, context, timeout)
        outcome = await _settled(host.provide(exchange))
        _judge(outcome, pairs, exchange, timeout)
        _keep(values, _answers(outcome, pairs, timeout), cached)
        return values
    tasks = {}
    for (host, _), pairs in by_host.items():
        exchange = _exchange(pairs, context, timeout)
        task = asyncio.ensure_future(host.provide(exchange))
        tasks[task] = (pairs, exchange)
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                _judge(task, *tasks[task], timeout)
            for task in done:  # the first failure under FAIL raises
                _keep(values, _answers(task, tasks[task][0], timeout), cached)
    finally:
        for task in tasks:
            task.cancel()
    return values


async def _settled(work: Awaitable[R]) -> asyncio.Future[R]:
    """`work` awaited here, its outcome held as a task's would be (a failure, not raised)."""
    settled: asyncio.Future[R] = asyncio.get_running_loop().create_future()
    try:
        settled.set_result(await work)
    except Exception as error:
        settled.set_exception(error)
    return settled


def _keep(
    values: dict[ValueRegistration, ProvidedValue],
    answers: list[tuple[ValueRegistration, ProvidedValue]],
    cached: _Cached | None,
) -> None:
    for entry, answer in answers:
        values[entry] = answer
        if cached is not None:
            cached.keep_answer(entry, answer)


def _answers(
    task: asyncio.Future[Mapping[str, ProvidedValue | errors.Failure]],
    pairs: Sequence[tuple[ValueRegistration, ProviderCall]],
    timeout: Timeout,
) -> list[tuple[ValueRegistration, ProvidedValue]]:
    """What one exchange answered, provider by provider. A failure (of the exchange, or a
    provider's own) raises, unless its providers' policy is IGNORE: then they are skipped."""
    error = task.exception()  # a cancelled exchange raises CancelledError here
    if isinstance(error, errors.Failure) and all(timeout.skips.ignores(e, error) for e, _ in pairs):
        for entry, _ in pairs:
            timeout.skips.skip(entry, error)
        return []
    answers = task.result()
    given: list[tuple[ValueRegistration, ProvidedValue]] = []
    for entry, call in pairs:
        answer = answers[call.key]
        if not isinstance(answer, errors.Failure):
            given.append((entry, answer))
        elif not timeout.skips.skip(entry, answer):
            raise answer
    return given


def _own_timeout(pairs: Sequence[tuple[ValueRegistration, ProviderCall]]) -> float | None:
    """The time one exchange with a host may take: the longest its providers declared."""
    owns = [_own(entry) for entry, _ in pairs]
    declared = [own for own in owns if own is not None]
    return max(declared) if declared else None


def _own(entry: ValueRegistration) -> float | None:
    return entry.value.timeout_s if isinstance(entry.value, Dynamic) else None


def _exchange(
    pairs: Sequence[tuple[ValueRegistration, ProviderCall]],
    context: AssembleContext,
    timeout: Timeout,
) -> Exchange:
    """What a host is asked: its calls in the time the longest of them declared, each
    call with its own time too (for a host whose providers answer one by one)."""
    return Exchange(
        calls=[call for _, call in pairs],
        context=context,
        timeout=timeout(_own_timeout(pairs)),
        times={call.key: timeout(_own(entry)) for entry, call in pairs},
    )


def _judge(
    task: asyncio.Future[Mapping[str, ProvidedValue | errors.Failure]],
    pairs: Sequence[tuple[ValueRegistration, ProviderCall]],
    exchange: Exchange,
    timeout: Timeout,
) -> None:
    """Tell the budget how a host's providers did (a timeout may eject them): a whole
    exchange that failed counts for each of its providers, and a provider that alone did
    not answer in its own time for itself only (those that answered are not blamed)."""
    error = None if task.cancelled() else task.exception()
    if isinstance(error, errors.Failure):
        own = _own_timeout(pairs)
        for entry, _ in pairs:
            timeout.failed(entry, error, exchange.timeout, own)
        return
    if error is not None:
        return
    answers = task.result()
    for entry, call in pairs:
        answer = answers.get(call.key)
        if isinstance(answer, errors.Failure) and answer.reason == Reason.PROVIDER_TIMEOUT:
            timeout.failed(entry, answer, exchange.times[call.key], _own(entry))
        else:
            timeout.answered(entry)


def _check_provided(
    values: dict[ValueRegistration, ProvidedValue], limits: Limits, timeout: Timeout
) -> None:
    """Provided values obey the limits registered ones do (one under IGNORE that does not
    is skipped)."""
    for entry, value in list(values.items()):
        try:
            if isinstance(value, str):
                limits.check_text("its answer", value)
            elif isinstance(value, ToolSet):
                limits.check_tools(value)
        except errors.RegistryError as error:
            call = entry.provider_call("")
            failure = errors.RegistryError(
                errors.Status.ABORTED, Reason.PROVIDER_FAILED, f"{call.describe()} failed: {error}"
            )
            if not timeout.skips.skip(entry, failure):
                raise failure from None
            del values[entry]


async def _rules(
    steps: list[StepRegistration],
    assembly: Assembly,
    inputs: Inputs,
    timeout: Timeout,
    origins: Origins | None,
    trace: Trace | None,
) -> Assembly:
    """The waterfall of a plan whose steps are all rules (none cached: a rule runs again for
    less than its result costs to keep), each in turn; one disposed while the assembly ran
    is passed over, as `_waterfall` does."""
    for entry in steps:
        assert isinstance(entry, RuleRegistration)  # a rules-only plan's steps
        if not entry.disposed:
            assembly = await run_rule(entry, assembly, inputs, timeout, origins, trace)
    return assembly


_FLAT_EVERY = 16  # listeners whose next() nest their frames before a task flattens them


async def _waterfall(
    listeners: list[StepRegistration],
    assembly: Assembly,
    context: AssembleContext,
    timeout: Timeout,
    origins: Origins | None,
    trace: Trace | None = None,
    cached: _Cached | None = None,
    inputs: Inputs | None = None,
) -> Assembly:
    run = _Waterfall(listeners, context, timeout, origins, trace, cached, inputs)
    return await run.step(0, assembly)


@dataclass(slots=True)
class _Waterfall:
    """One assembly's run through its plan's steps. An object, not nested functions: those
    held each other in their closures' cells, a cycle that kept every assembly's plan,
    context and parts alive until a full garbage collection."""

    listeners: list[StepRegistration]
    context: AssembleContext
    timeout: Timeout
    origins: Origins | None
    trace: Trace | None
    cached: _Cached | None
    inputs: Inputs | None
    tail: int = field(init=False)  # where the cacheable tail starts (-1: none, or running)

    def __post_init__(self) -> None:
        cached = self.cached
        self.tail = len(self.listeners) - len(cached.plan.cacheable_tail) if cached else -1

    async def step(self, index: int, current: Assembly) -> Assembly:
        """The steps from `index` on, handed `current`."""
        listeners, timeout, origins, trace = self.listeners, self.timeout, self.origins, self.trace
        while True:  # the rules up to the next listener run here, one after the other
            if index == self.tail < len(listeners) and self.cached is not None:
                return await self.cached_tail(index, current, self.cached)
            if index == len(listeners):
                return current
            entry = listeners[index]
            if not entry.disposed and isinstance(entry, RuleRegistration):
                assert self.inputs is not None
                current = await run_rule(entry, current, self.inputs, timeout, origins, trace)
            elif not entry.disposed:
                break
            index += 1  # a rule done, or a step disposed while the assembly ran: skipped
        assert isinstance(entry, ListenerRegistration)
        listener = entry
        made = step_origin(listener)  # the listener with its layer, as reports name it
        from_next: list[Assembly] = []
        passed_on: list[errors.Failure] = []

        async def next_(handed: Assembly) -> Assembly:
            if origins is not None:  # what the listener changed before next()
                record_changes(origins, current, handed, made)
            if trace is not None:
                trace.record(snapshot(handed), made)
            rest = self.step(index + 1, handed)
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
            result = await listener.value.invoke(current, self.context, next_, given)
        except errors.Failure as error:
            if any(passed is error for passed in passed_on):
                raise  # the rest of the chain's failure, passed through
            timeout.failed(listener, error, given, own)
            if passed_on and timeout.skips.ignores(listener, error):
                raise passed_on[0] from None  # skipping it leaves the rest's failure
            if not timeout.skips.skip(listener, error):
                raise
            if not from_next:  # passed over, as if it had called next() unchanged
                return await self.step(index + 1, current)
            return from_next[0]  # the rest ran once: what it returned stands
        timeout.answered(listener)
        if origins is not None:  # what it changed after next(), or instead of it
            before = from_next[0] if from_next else current
            record_changes(origins, before, result, made)
        if trace is not None:
            trace.record(snapshot(result), made)
        return result

    async def cached_tail(self, index: int, given: Assembly, cached: _Cached) -> Assembly:
        """The cacheable tail of the waterfall: its kept result for this input, or
        run it (as from the tail's first listener on) and keep what it returns."""
        kept = cached.result(given)
        if kept is not None:
            return kept
        self.tail = -1  # run the tail itself, once
        skipped = len(self.timeout.skips.steps)
        result = await self.step(index, given)
        if len(self.timeout.skips.steps) == skipped:  # a result with a step skipped is not kept
            cached.keep_result(given, result)
        return result
