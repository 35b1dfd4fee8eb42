"""Rules as steps of the waterfall: what they read besides the assembly, made once per
assembly, and one rule's step with its failure policy and its provenance."""

from __future__ import annotations

import contextlib

from .. import errors
from ..callbacks import Budget
from ..limits import Limits
from ..model import AssembleContext, Assembly, RuleRegistration
from ..provenance import OriginKind, Origins, Trace
from ..rules import Inputs, Rule, apply_yielding
from .origins import record_changes, snapshot, step_origin
from .plan import Plan


def rule_inputs(plan: Plan, context: AssembleContext, limits: Limits) -> Inputs | None:
    """What the plan's rules read besides the assembly (None when it has no rule)."""
    if not plan.has_rules:
        return None
    if plan.part_orders is None:  # the same at every assembly of the plan
        plan.part_orders = {
            "sections": {entry.name: entry.order for entry in plan.sections},
            "contexts": {entry.name: entry.order for entry in plan.contexts},
        }
    return Inputs(
        fields_json=context.fields_json,
        _fields=context.fields,
        scope=context.scope or "",
        chain=list(plan.chain),
        limits=limits,
        orders=plan.part_orders,
    )


async def run_rule(
    rule: RuleRegistration,
    current: Assembly,
    inputs: Inputs,
    budget: Budget,
    origins: Origins | None,
    trace: Trace | None,
) -> Assembly:
    """One rule's step: what it makes of `current`, or `current` when it fails under IGNORE;
    in a span of its own (`rule "name"`) when the sidecar traces, and counted by outcome
    (ok, skipped under IGNORE, failed under FAIL)."""
    compiled = rule.value
    assert isinstance(compiled, Rule)  # a rule registration holds one
    spans = budget.spans
    span = contextlib.nullcontext() if spans is None else spans(f'rule "{rule.name}"')
    try:
        with span:
            result = await apply_yielding(compiled, current, inputs)
    except errors.Failure as error:
        if not budget.skips.skip(rule, error):
            budget.ran(rule, "failed")
            raise
        budget.ran(rule, "skipped")
        return current
    budget.ran(rule, "ok")
    if result is not current:
        made = step_origin(rule, OriginKind.RULE)
        if origins is not None:
            record_changes(origins, current, result, made)
        if trace is not None:
            trace.record(snapshot(result), made)
    return result
