"""The plans the registry keeps between assemblies: one per scope key, reused until a
change to what it is made of (its chain's revision, `revisions`), the 1,024 most
recently used. A disposal drops the plans made of its layer at once: they are stale, and
what they hold (the disposed registrations, a listener's stream and last assembly) goes
with them rather than when the key is assembled again or evicted."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from .assembly import Plan, plan_of
from .callbacks import ListenerIndex
from .layers import Layers, ScopeTree
from .reach import Reaches
from .revisions import LayerRevisions

_PLANS_KEPT = 1024  # scopes whose plan is remembered between assemblies

# A plan's key: a scope key with a layer (None: the global one), or, for a key without a
# layer whose global plan holds callbacks out of some owner's reach, the ids passed over.
_Key = str | None | frozenset[str]


class PlanCache:
    """The plan of each scope key, made from the layers along its chain when asked at a
    revision its chain has moved from (a re-bound parent is a change of the scope's own key,
    so the chain it was made on tells), without the callbacks out of their owner's reach."""

    def __init__(
        self,
        layers: Layers,
        scopes: ScopeTree,
        listeners: ListenerIndex,
        revisions: LayerRevisions,
    ) -> None:
        self._layers = layers
        self._scopes = scopes
        self._listeners = listeners
        self._revisions = revisions
        self.reaches = Reaches()  # each owner's, bound by the layer above (registry/reach.py)
        self._plans: OrderedDict[_Key, Plan] = OrderedDict()
        # each scope key: the keys of the kept plans whose chain it is on
        self._made_of: dict[str, set[_Key]] = {}
        self.cleared = 0  # moves with every clear(): what was kept for a plan before goes

    def plan(self, scope: str | None, include_runtime_context: bool, asked: str | None) -> Plan:
        """The plan for `scope` (a key with a layer, or None) now, for an assembly of `asked`
        (the key the caller named: `scope`, or one without a layer)."""
        plan = self._kept(scope)
        if plan is None:
            chain = self._scopes.chain(scope)
            plan = self._make_plan(chain, self._revisions.of(chain), include_runtime_context)
            self._keep(scope, plan)
        if scope is not None or asked is None:
            return plan
        # A key without a layer shares the global plan, made for the global scope (which
        # every owner reaches): its callbacks out of reach of `asked` are passed over here.
        out = self.reaches.out_of_reach(plan.callbacks(), asked)
        if not out:
            return plan
        key = frozenset(skipped.registration_id for skipped in out)
        narrowed = self._kept(key)
        if narrowed is None or narrowed.revision != plan.revision:
            narrowed = plan.without(out)
            self._keep(key, narrowed)
        return narrowed

    def clear(self) -> None:
        """Forget every plan (an owner's reach changed: no revision says so)."""
        self._plans.clear()
        self._made_of.clear()
        self.cleared += 1

    def drop(self, layers: Iterable[str | None]) -> None:
        """Forget the plans made of `layers` (None: the global layer, which every plan is
        made of): a disposal there left them stale."""
        for layer in layers:
            if layer is None:
                self._plans.clear()
                self._made_of.clear()
                return
            for key in self._made_of.pop(layer, set()):
                self._forget(key)

    def _kept(self, key: _Key) -> Plan | None:
        plan = self._plans.get(key)
        if plan is None or plan.revision != self._revisions.of(plan.chain):
            return None
        self._plans.move_to_end(key)
        return plan

    def _keep(self, key: _Key, plan: Plan) -> None:
        self._forget(key)  # the plan it replaces may have been made of another chain
        self._plans[key] = plan
        for layer in plan.chain:
            self._made_of.setdefault(layer, set()).add(key)
        if len(self._plans) > _PLANS_KEPT:
            self._forget(next(iter(self._plans)))

    def _forget(self, key: _Key) -> None:
        plan = self._plans.pop(key, None)
        for layer in plan.chain if plan is not None else ():
            keys = self._made_of.get(layer)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._made_of[layer]

    def _make_plan(self, chain: list[str], revision: int, include_runtime_context: bool) -> Plan:
        layers = self._layers.along(chain)
        plan = plan_of(
            revision,
            chain,
            layers,
            include_runtime_context,
            self._listeners.admitted(chain),
        )
        out = self.reaches.out_of_reach(plan.callbacks(), chain[0] if chain else None)
        return plan.without(out) if out else plan
