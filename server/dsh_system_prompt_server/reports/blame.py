"""Why a prefix broke: the first differing part, and who changed it, in words a person acts on.

A part goes through steps: what its registration (or provider) gave, then
each listener and rule in the order the data flowed. The blame goes to the first step
whose output differs from the previous assembly's same step while its input
did not: a listener that appends a fixed suffix to a text changed upstream is
not blamed; the upstream change is. Upstream changes then say what moved in
the layers (a re-parented scope, a new or removed shadowing entry) or which
variables changed, and who set them. A reason keeps each listener and rule it names with
its place (`words`), so that each reader is shown its own words (shown.py).
"""

from __future__ import annotations

from ..registry import Origin, OriginKind, PartKey, PartKind, Step, Trace
from .values import PartPrint, Previous
from .words import Words, joined, said

MAX_VARIABLES = 4  # changed variables a reason names; the rest are counted


def explain(index: int, current: Previous, previous: Previous) -> tuple[str, Words, PartKey]:
    """The first changed part at position `index`, the reason, and the part's key.

    A part removed names itself at its old place; a part added or moved names
    what it now stands before.
    """
    now = current.parts[index] if index < len(current.parts) else None
    before = previous.parts[index] if index < len(previous.parts) else None
    if now is not None and before is not None and now.key == before.key:
        return now.label, _changed(now, before, current, previous), now.key
    if before is not None and before.key not in {p.key for p in current.parts}:
        reason = said(f"{before.label} removed", _removed_by(before.key, current))
        return before.label, reason, before.key
    assert now is not None
    where = " at the end" if before is None else f" before {_relative(now, before)}"
    if now.key not in {p.key for p in previous.parts}:
        return now.label, said(f"{now.label} added{where}", _added_by(now)), now.key
    return now.label, said(f"{now.label} moved{where}"), now.key


def _relative(part: PartPrint, other: PartPrint) -> str:
    return f'"{other.name}"' if part.kind == other.kind else other.label


def _changed(now: PartPrint, before: PartPrint, current: Previous, previous: Previous) -> Words:
    culprit = _culprit(now.key, current.trace, previous.trace)
    if culprit:
        return said(culprit, f" changed {now.label}")
    layer = _layer_change(now.origin, before.origin, current.trace, previous.trace)
    if layer:
        return said(f"{now.label} ", layer)
    if now.kind is PartKind.TOOL:
        what = "parameters" if now.parameters != before.parameters else "description"
        return said(f"{now.label} {what} changed")
    if now.raw == before.raw:
        earlier = dict(before.variables)
        changed = [name for name, value in now.variables if earlier.get(name, value) != value]
        if changed:
            which = _variables_changed(changed, current, previous)
            return said(f"{now.label} text changed (", which, ")")
    return said(f"{now.label} text changed")


def _variables_changed(changed: list[str], current: Previous, previous: Previous) -> Words:
    """`variable {{a}} changed`, with who set each one when that is worth saying; the
    first `MAX_VARIABLES` named and the rest counted, so a section referencing thousands
    of variables, each set by a listener, does not make a reason of megabytes."""
    named = [
        (f"{{{{{name}}}}}", _who_set(name, current, previous)) for name in changed[:MAX_VARIABLES]
    ]
    more = len(changed) - len(named)
    if not any(who for _, who in named):
        noun = "variable" if len(changed) == 1 else "variables"
        references = ", ".join(reference for reference, _ in named)
        return said(f"{noun} {references}{f' and {more} more' if more else ''} changed")
    each = [
        said(f"variable {reference} changed", *((", ", who) if who else ()))
        for reference, who in named
    ]
    if more:
        each.append(said(f"{more} more variables changed"))
    return joined("; ", each)


def _who_set(name: str, current: Previous, previous: Previous) -> Words:
    """A listener that set the variable, or how its layer changed; nothing for neither."""
    culprit = _culprit((PartKind.VARIABLE, name), current.trace, previous.trace)
    if culprit:
        return said("set by ", culprit)
    now, before = current.variables.get(name), previous.variables.get(name)
    if now is None or before is None:
        return Words()
    return _layer_change(now, before, current.trace, previous.trace)


def _culprit(key: PartKey, current: Trace | None, previous: Trace | None) -> Words:
    """The listener or rule whose own step changed `key` (`listener "x"`, `rule "y"`):
    nothing when the change came from upstream."""
    if current is None or previous is None:
        return Words()
    for now, before in zip(current.steps, previous.steps, strict=False):
        if (now.kind, now.listener) != (before.kind, before.listener):  # the steps changed:
            return _changer(key, current) or _changer(key, previous)  # who touched it here
        if now.values.get(key) != before.values.get(key):
            return _maker(now)
    return Words()


def _changer(key: PartKey, trace: Trace) -> Words:
    """The first listener or rule in `trace` whose step changed `key`."""
    for earlier, later in zip(trace.steps, trace.steps[1:], strict=False):
        if earlier.values.get(key) != later.values.get(key):
            return _maker(later)
    return Words()


def _maker(step: Step) -> Words:
    """The listener or rule that made `step`, as `Step.describe` names it, kept with its
    layer; nothing for the first step (what the registrations gave) or a nameless one."""
    if step.listener and step.origin is not None:
        return said(step.origin)  # its describe() is the step's
    return said(step.describe())


def _removed_by(key: PartKey, current: Previous) -> Words:
    trace = current.trace
    if trace is None or not trace.steps or key not in trace.steps[0].values:
        return Words()  # its registration is gone
    for step in trace.steps[1:]:
        if key not in step.values:
            return said(" (by ", _maker(step), ")")
    return Words()


def _added_by(part: PartPrint) -> Words:
    if part.origin.kind in (OriginKind.LISTENER, OriginKind.RULE):
        return said(" (by ", part.origin, ")")
    return Words()


def _layer_change(
    now: Origin, before: Origin, current: Trace | None, previous: Trace | None
) -> Words:
    """How the layer a value comes from changed: re-parenting, shadowing, un-shadowing."""
    if now == before or OriginKind.LISTENER in (now.kind, before.kind):
        return Words()
    chain = current.chain if current else ()
    old_chain = previous.chain if previous else ()
    if chain != old_chain and OriginKind.SCOPE in (now.kind, before.kind):
        reparented = _reparented(chain, old_chain)
        return said("now from ", now, ", was ", before, f": {reparented}")
    if _nearness(now) > _nearness(before):
        return said("now from ", now, ", shadowing ", before)
    if _nearness(now) < _nearness(before):
        return said("no longer shadowed: now from ", now, ", was ", before)
    return said("now from ", now, ", was ", before)


def _reparented(chain: tuple[str, ...], old_chain: tuple[str, ...]) -> str:
    index = next(
        (i for i, (a, b) in enumerate(zip(chain, old_chain, strict=False)) if a != b),
        min(len(chain), len(old_chain)),
    )
    child = chain[index - 1] if index else (chain or old_chain or ("",))[0]
    was = f'"{old_chain[index]}"' if index < len(old_chain) else "no parent"
    now = f'"{chain[index]}"' if index < len(chain) else "no parent"
    return f'scope "{child}" re-parented from {was} to {now}'


def _nearness(origin: Origin) -> int:
    """Which layer wins: a scope nearer the assembly's own beats its ancestors and global."""
    if origin.kind is OriginKind.BUILTIN:
        return 0
    if origin.kind is OriginKind.GLOBAL:
        return 1
    return 1_000_000 - origin.depth
