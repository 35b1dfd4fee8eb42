"""The plans the registry keeps between assemblies: one per scope key, reused until a
change to what it is made of (its chain's revision, `revisions`), the 1,024 most
recently used."""

from __future__ import annotations

from collections import OrderedDict

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
        self.cleared += 1

    def _kept(self, key: _Key) -> Plan | None:
        plan = self._plans.get(key)
        if plan is None or plan.revision != self._revisions.of(plan.chain):
            return None
        self._plans.move_to_end(key)
        return plan

    def _keep(self, key: _Key, plan: Plan) -> None:
        self._plans[key] = plan
        self._plans.move_to_end(key)
        if len(self._plans) > _PLANS_KEPT:
            self._plans.popitem(last=False)

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
