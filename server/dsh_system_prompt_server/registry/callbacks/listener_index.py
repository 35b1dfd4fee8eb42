"""The installed waterfall steps, indexed for plans: listeners and rules, those that run
everywhere and those by scope, in one order."""

from __future__ import annotations

from fnmatch import fnmatchcase

from ..model import ListenerRegistration, RuleRegistration, StepRegistration


class ListenerIndex:
    """Every live waterfall step (a listener or a rule), found by the scope chain an assembly
    runs on, in run order.

    A step registered globally, or with `global_`, runs for every scope; one registered in a
    scope runs for that scope and the scopes below it; an operator's rule with a scope
    `pattern` runs where a key of the chain matches it. Positions grow with every install,
    listeners and rules alike; a prepended step takes a negative one, so it runs before every
    step installed earlier.
    """

    def __init__(self) -> None:
        self._everywhere: dict[str, StepRegistration] = {}
        self._by_scope: dict[str, dict[str, StepRegistration]] = {}
        self._installed = 0  # steps ever installed: the next one's position
        self.listeners = 0  # of which live listeners (the listener quota counts these)
        self.rules = 0

    def __len__(self) -> int:
        """How many listeners are installed (rules have their own count, `rules`)."""
        return self.listeners

    def next_position(self, prepend: bool) -> int:
        """The position of the step about to be installed."""
        self._installed += 1
        return -self._installed if prepend else self._installed

    def add(self, entry: StepRegistration) -> None:
        if entry.scope is None or entry.global_:
            self._everywhere[entry.id] = entry
        else:
            self._by_scope.setdefault(entry.scope, {})[entry.id] = entry
        self._count(entry, 1)

    def remove(self, entry: StepRegistration) -> None:
        """Take `entry` out; a listener's host is told it will not be invoked again."""
        if isinstance(entry, ListenerRegistration):
            entry.value.disposed()
        self._count(entry, -1)
        if self._everywhere.pop(entry.id, None) is not None:
            return
        assert entry.scope is not None
        scoped = self._by_scope[entry.scope]
        del scoped[entry.id]
        if not scoped:
            del self._by_scope[entry.scope]

    def rules_in(self, scope: str | None) -> list[RuleRegistration]:
        """The rules whose layer is `scope`'s (the global one for None)."""
        entries = self._everywhere if scope is None else self._by_scope.get(scope, {})
        found = [e for e in entries.values() if isinstance(e, RuleRegistration)]
        if scope is not None:  # a global rule of a scope's layer sits among the everywhere ones
            found += [
                e
                for e in self._everywhere.values()
                if isinstance(e, RuleRegistration) and e.scope == scope
            ]
        return [e for e in found if e.scope == scope]

    def admitted(self, chain: list[str]) -> list[StepRegistration]:
        """The steps an assembly on the scope `chain` runs, in order."""
        admitted = [
            entry
            for entry in self._everywhere.values()
            if not isinstance(entry, RuleRegistration)
            or entry.pattern is None
            or any(fnmatchcase(key, entry.pattern) for key in chain)
        ]
        for key in chain:
            admitted.extend(self._by_scope.get(key, {}).values())
        admitted.sort(key=lambda entry: entry.position)
        return admitted

    def _count(self, entry: StepRegistration, change: int) -> None:
        if isinstance(entry, RuleRegistration):
            self.rules += change
        else:
            self.listeners += change
