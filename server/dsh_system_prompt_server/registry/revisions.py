"""The revision of the last change to each layer, so that what an assembly is made of
(its scope chain's layers and the global one) has a revision of its own: the chain's
revision, which moves when, and only when, one of those layers changes.

Every cache of assemblies (plans, the callback cache, the kept Assemble responses, the
clients' local caches) is keyed by it rather than by the registry's revision, so a
change in one agent's scope leaves every other scope's kept answers in place.

A chain's revision is the largest of its layers' (the global layer's among them): a
change to any of them is numbered above every revision before it, so the chain's moves
too, and it stays comparable with the change events' revisions. A key no longer known
is forgotten, its revision folded into `floor`, which every unknown key reads: no key's
revision ever goes back, so no chain's revision comes back to one an older state had.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .model import AnyRegistration, ScopeHandle, runs_everywhere

_SWEEP_AT = 1024  # keys remembered beyond the live ones before forgotten keys are swept


class LayerRevisions:
    """The last change's revision of the global layer and of each scope key."""

    def __init__(self) -> None:
        self._global = 0
        self._scoped: dict[str, int] = {}
        self.floor = 0  # the largest revision of a forgotten key: what an unknown key reads
        self._sweep_at = _SWEEP_AT

    def changed(self, layer: str | None, revision: int) -> None:
        """A change numbered `revision` in `layer` (None: the global layer, which every
        chain reads: settings, built-ins and steps that run everywhere count there)."""
        if layer is None:
            self._global = revision
        else:
            self._scoped[layer] = revision

    def published(
        self,
        entry: AnyRegistration,
        revision: int,
        known: Callable[[str], bool],
        rebound: Iterable[str] = (),
    ) -> tuple[str | None, ...]:
        """`entry`'s change, numbered `revision`, is out: a step that runs everywhere
        changes every chain, whichever layer it was made in; a key whose parent binding
        it made or undid (`rebound`) changes as its layer would, since a chain kept from
        before still names it (a key forgotten with its parent otherwise reads as it
        did); a scope handle's end may have left keys no one holds (`known` says which
        are held). Returns the layers it changed."""
        layers = (None if runs_everywhere(entry) else entry.scope, *rebound)
        for layer in layers:
            self.changed(layer, revision)
        if isinstance(entry, ScopeHandle) and entry.disposed:
            self.sweep(known)
        return layers

    def of(self, keys: Iterable[str]) -> int:
        """The revision of the chain of `keys` (and the global layer)."""
        scoped, floor = self._scoped, self.floor
        revision = self._global
        for key in keys:
            layer = scoped.get(key, floor)
            if layer > revision:
                revision = layer
        return revision

    def sweep(self, known: Callable[[str], bool]) -> None:
        """Forget the keys `known` no longer holds, once enough have gone: bounds what a
        client opening and closing scopes under fresh keys leaves behind."""
        if len(self._scoped) < self._sweep_at:
            return
        for key in [key for key in self._scoped if not known(key)]:
            self.floor = max(self.floor, self._scoped.pop(key))
        self._sweep_at = max(_SWEEP_AT, 2 * len(self._scoped))

    def __len__(self) -> int:
        return len(self._scoped)
