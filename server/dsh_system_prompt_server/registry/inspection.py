"""What the registry shows of itself (its registrations, listings by filter, the scope keys and
chains, a session's scope handles), its owners' drops of their callbacks' cached answers, and
how far each owner's callbacks reach (registry/reach.py): the `Registry`'s sides that change no
registration."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from .callbacks import CallbackCache
from .filters import Filter, listed
from .layers import ScopeTree
from .model import AnyRegistration, Dynamic, Kind, ScopeHandle

if TYPE_CHECKING:
    from .plan_cache import PlanCache
    from .reach import Reach


class Inspection:
    """Reads of the registrations the `Registry` keeps (it sets these attributes)."""

    _entries: dict[str, AnyRegistration]
    _by_owner: dict[str, dict[str, AnyRegistration]]
    _scopes: ScopeTree

    def registrations(self, owner: str | None = None) -> list[AnyRegistration]:
        """Every live registration (of `owner`, when given), oldest first."""
        if owner is None:
            return list(self._entries.values())
        return list(self._by_owner.get(owner, {}).values())

    def registration_count(self) -> int:
        """How many registrations are live, without listing them (for metrics scrapes)."""
        return len(self._entries)

    def scope_keys(self) -> list[str]:
        return self._scopes.keys()

    def keeps(self, wanted: Filter) -> Callable[[Kind, str | None], bool]:
        """A test of (kind, layer) against `wanted`, on the scope tree as it is when asked."""
        return wanted.matcher(self._scopes.chain)

    def listing(self, wanted: Filter) -> list[AnyRegistration]:
        """The live registrations `wanted` keeps, oldest first (the built-ins first)."""
        keeps = self.keeps(wanted)
        return [entry for entry in self._entries.values() if listed(keeps, entry)]

    def scope_chain(self, scope: str | None) -> list[str]:
        """The scope, its parent, ... farthest ancestor last; empty for the global scope."""
        return self._scopes.chain(scope)

    def handle_key(self, owner: str, handle: str) -> str | None:
        """The scope key of `owner`'s scope handle `handle`; None when it holds no such one."""
        entry = self._by_owner.get(owner, {}).get(handle)
        return entry.name if isinstance(entry, ScopeHandle) else None


class Invalidation:
    """Owners dropping their callbacks' cached answers (the `Registry` sets these)."""

    _by_owner: dict[str, dict[str, AnyRegistration]]
    callbacks: CallbackCache

    def invalidate_providers(self, owner: str, provider_keys: Collection[str]) -> None:
        """Drop the cached answers of `owner`'s providers with these keys (all, if none)."""
        self.callbacks.invalidate(
            entry.id
            for entry in self._by_owner.get(owner, {}).values()
            if isinstance(entry.value, Dynamic)
            and (not provider_keys or entry.value.key in provider_keys)
        )

    def invalidate_listener(self, owner: str, registration_id: str) -> None:
        """Drop the cached results that `owner`'s listener had a part in."""
        if registration_id in self._by_owner.get(owner, {}):
            self.callbacks.invalidate([registration_id])


class Reaching:
    """Owners bound to how far their steps and providers reach (the `Registry` sets these)."""

    _by_owner: dict[str, dict[str, AnyRegistration]]
    _plans: PlanCache

    @property
    def reach_epoch(self) -> int:
        """Moves whenever an owner's reach is bound anew and the plans remade: a response
        kept for a request's very bytes before then is not reused (no revision moved)."""
        return self._plans.cleared

    def bind_reach(self, owner: str, reach: Reach | None) -> None:
        """`owner`'s steps and dynamic providers run only where `reach` reads (None: every
        scope). Bound before it registers anything; bound again (a credential narrowed),
        the plans are remade, since no revision says so."""
        if self._plans.reaches.bind(owner, reach) and owner in self._by_owner:
            self._plans.clear()
