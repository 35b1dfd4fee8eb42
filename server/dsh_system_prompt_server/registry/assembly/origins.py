"""Provenance recorded: where each part of an assembly came from (asked for by reports)."""

from __future__ import annotations

from ..model import SIDECAR_OWNER, AnyRegistration, Assembly, runs_everywhere
from ..provenance import Origin, OriginKind, Origins, PartKind, Values


def entry_origin(entry: AnyRegistration, chain: list[str]) -> Origin:
    """Where a registration's part comes from, seen from the scope `chain[0]`."""
    if entry.owner == SIDECAR_OWNER:
        return Origin(kind=OriginKind.BUILTIN)
    if entry.scope is None:
        return Origin(kind=OriginKind.GLOBAL)
    return Origin(
        kind=OriginKind.SCOPE,
        scope=entry.scope,
        depth=chain.index(entry.scope),
        for_scope=chain[0] if chain else None,
    )


def step_origin(entry: AnyRegistration, step: OriginKind = OriginKind.LISTENER) -> Origin:
    """The origin of what the listener (or rule, by `step`) `entry` makes, with the layer it
    is held in: a report names it only to who is shown its name (reports/shown.py)."""
    return Origin(
        kind=step, listener=entry.name, held=entry.scope, everywhere=runs_everywhere(entry)
    )


def record_changes(origins: Origins, before: Assembly, after: Assembly, origin: Origin) -> None:
    """Credit the step `origin` (a listener or rule) with every part of `after` it added or
    changed since `before`."""
    for kind, old, new in (
        (PartKind.SECTION, before.sections, after.sections),
        (PartKind.CONTEXT, before.contexts, after.contexts),
    ):
        previous = {part.name: part.text for part in old}
        for part in new:
            if previous.get(part.name) != part.text:
                origins[(kind, part.name)] = origin
    previous_tools = {tool.name: tool for tool in before.tools}
    for tool in after.tools:
        if previous_tools.get(tool.name) != tool:
            origins[(PartKind.TOOL, tool.name)] = origin
    for name, value in after.variables.items():
        if name not in before.variables or before.variables[name] != value:
            origins[(PartKind.VARIABLE, name)] = origin


def snapshot(assembly: Assembly) -> Values:
    """Hashes of the sections, tools and variables of `assembly` (contexts are not prefix)."""
    values: Values = {(PartKind.SECTION, part.name): hash(part.text) for part in assembly.sections}
    for tool in assembly.tools:
        values[(PartKind.TOOL, tool.name)] = hash((tool.description, tool.parameters_json))
    for name, value in assembly.variables.items():
        values[(PartKind.VARIABLE, name)] = hash(value)
    return values
