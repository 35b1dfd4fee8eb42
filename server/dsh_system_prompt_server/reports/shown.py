"""A report's texts as one caller is shown them: listeners and rules held outside its
credential's scopes named by their layer alone.

A report and its key's history keep their reasons as written, naming every step, with
where each names a step and the layer it is held in (`PrefixStability.steps`, `Break.steps`:
words.py), so that two steps of one kind and name in different layers are told apart;
whoever answers a caller (Assemble's report, GetCacheHistory, the admin page) renders them
here for that caller's `shows` (guard.shown_steps), as an assembly's `skipped` is
(registry.shown_skipped; docs/operations.md, "Trust model").
"""

from __future__ import annotations

from collections.abc import Callable

from ..registry import Origin
from .words import Named

Shows = Callable[[str | None], bool] | None  # the layers whose steps are named; None: all


def hidden(origin: Origin, shows: Shows) -> bool:
    """Whether `origin` is a listener or rule whose name the caller is not shown."""
    return shows is not None and origin.step and not shows(origin.held)


def shown_origin(origin: Origin, shows: Shows) -> Origin:
    """`origin` as the caller is shown it: a step held outside its scopes without its name,
    in the global layer when it runs everywhere."""
    return origin.unnamed() if hidden(origin, shows) else origin


def shown_reason(reason: str, steps: tuple[Named, ...], shows: Shows) -> str:
    """`reason` with each place of the `steps` that names a step the caller is not shown by
    name describing it by its layer alone (`a listener (global)`): a step of the same kind and
    name held in a layer it is shown keeps its name."""
    for at, origin in sorted(steps, key=lambda named: -named.at):  # the last first
        if hidden(origin, shows):
            end = at + len(origin.describe())
            reason = reason[:at] + shown_origin(origin, shows).describe() + reason[end:]
    return reason
