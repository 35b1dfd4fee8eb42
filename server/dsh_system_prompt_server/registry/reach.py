"""How far each owner's callbacks reach: a waterfall step (a listener or a rule) or a dynamic
provider runs for an assembly only when its owner may read the assembly's scope.

A step registered in a parent scope would otherwise be handed every assembly of every scope
below it, and a provider asked with their context (their fields, their variables): a way to
read, and rewrite, a scope its owner may not read directly. Elsewhere it is passed over and
the assembly names it in `skipped` with reason OUT_OF_REACH, so an operator sees it.

Who may read what, the registry does not know: the layer above binds each owner (a session)
to a `Reach` before the owner registers anything. An owner bound to none reaches every scope:
a session without credentials (no auth configured), one whose credential reaches everywhere
(an admin, or an agent granted `global_listeners`), the sidecar's own operator rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from dsh_system_prompt_core import Reason

from .model import AnyRegistration, Dynamic, Kind, ListenerRegistration, Skipped, runs_everywhere


@dataclass(frozen=True, slots=True)
class Reach:
    """The scopes an owner's callbacks run for: those whose key matches one of `scopes`
    (fnmatch patterns, as a credential lists them); `owner` names it in skipped steps."""

    owner: str  # e.g. 'credential "alice"'
    scopes: tuple[str, ...]

    def reads(self, scope: str | None) -> bool:
        """Whether an assembly of `scope` is within reach (the global scope always is:
        every credential may read the global layer)."""
        return scope is None or any(fnmatchcase(scope, pattern) for pattern in self.scopes)


class Reaches:
    """The `Reach` each owner was bound to; an owner bound to none reaches everywhere."""

    def __init__(self) -> None:
        self._of: dict[str, Reach] = {}  # by owner

    def bind(self, owner: str, reach: Reach | None) -> bool:
        """`owner`'s callbacks reach `reach` from now on (None: every scope); whether that
        changed anything."""
        before = self._of.pop(owner, None)
        if reach is not None:
            self._of[owner] = reach
        return before != reach

    def unbind(self, owner: str) -> None:
        """`owner` is gone, with everything it registered."""
        self._of.pop(owner, None)

    def out_of_reach(self, entries: Iterable[AnyRegistration], scope: str | None) -> list[Skipped]:
        """Of `entries` (steps and dynamic providers), those whose owner may not read
        `scope`, each as the assembly names it in `skipped`."""
        if not self._of or scope is None:
            return []
        passed: list[Skipped] = []
        for entry in entries:
            reach = self._of.get(entry.owner)
            if reach is not None and not reach.reads(scope):
                passed.append(_passed_over(entry, reach))
        return passed


def _passed_over(entry: AnyRegistration, reach: Reach) -> Skipped:
    # The message does not name the assembly's scope: keys without a layer share one plan.
    return Skipped(
        kind=entry.kind,
        name=entry.name,
        scope=entry.scope,
        registration_id=entry.id,
        reason=str(Reason.OUT_OF_REACH),
        message=(
            f"{_describe(entry)} was not run: its owner, {reach.owner}, may not read"
            " this assembly's scope"
        ),
        everywhere=runs_everywhere(entry),
    )


def _describe(entry: AnyRegistration) -> str:
    """`listener "redact" in scope "team"`, `rule "no-web" (global)`, `section provider ...`."""
    if isinstance(entry.value, Dynamic):
        return entry.provider_call("").describe()
    where = f' in scope "{entry.scope}"' if entry.scope is not None else " (global)"
    noun = "listener" if isinstance(entry, ListenerRegistration) else Kind.RULE.value
    return f'{noun} "{entry.name}"{where}' if entry.name else f"a {noun}{where}"
