"""The installed listeners, indexed for plans: those that run everywhere and those by scope."""

from __future__ import annotations

from ..model import ListenerRegistration


class ListenerIndex:
    """Every live listener, found by the scope chain an assembly runs on, in run order.

    A listener registered globally, or with `global_`, runs for every scope; one
    registered in a scope runs for that scope and the scopes below it. Positions
    grow with every install; a prepended listener takes a negative one, so it
    runs before every listener installed earlier.
    """

    def __init__(self) -> None:
        self._everywhere: dict[str, ListenerRegistration] = {}
        self._by_scope: dict[str, dict[str, ListenerRegistration]] = {}
        self._installed = 0  # listeners ever installed: the next one's position

    def __len__(self) -> int:
        return len(self._everywhere) + sum(map(len, self._by_scope.values()))

    def next_position(self, prepend: bool) -> int:
        """The position of the listener about to be installed."""
        self._installed += 1
        return -self._installed if prepend else self._installed

    def add(self, entry: ListenerRegistration) -> None:
        if entry.scope is None or entry.global_:
            self._everywhere[entry.id] = entry
        else:
            self._by_scope.setdefault(entry.scope, {})[entry.id] = entry

    def remove(self, entry: ListenerRegistration) -> None:
        """Take `entry` out, and tell its host it will not be invoked again."""
        entry.value.disposed()
        if self._everywhere.pop(entry.id, None) is not None:
            return
        assert entry.scope is not None
        scoped = self._by_scope[entry.scope]
        del scoped[entry.id]
        if not scoped:
            del self._by_scope[entry.scope]

    def admitted(self, chain: list[str]) -> list[ListenerRegistration]:
        """The listeners an assembly on the scope `chain` runs, in order."""
        admitted = list(self._everywhere.values())
        for key in chain:
            admitted.extend(self._by_scope.get(key, {}).values())
        admitted.sort(key=lambda entry: entry.position)
        return admitted
