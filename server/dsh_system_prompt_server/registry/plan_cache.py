"""The plans the registry keeps between assemblies: one per scope key, reused until a
change (a new revision), the 1,024 most recently used."""

from __future__ import annotations

from collections import OrderedDict

from .assembly import Plan, plan_of
from .callbacks import ListenerIndex
from .layers import Layers, ScopeTree

_PLANS_KEPT = 1024  # scopes whose plan is remembered between assemblies


class PlanCache:
    """The plan of each scope key, made from the layers along its chain when asked at a
    revision it was not made at."""

    def __init__(self, layers: Layers, scopes: ScopeTree, listeners: ListenerIndex) -> None:
        self._layers = layers
        self._scopes = scopes
        self._listeners = listeners
        self._plans: OrderedDict[str | None, Plan] = OrderedDict()

    def plan(self, scope: str | None, revision: int, include_runtime_context: bool) -> Plan:
        """The plan for `scope` (a key with a layer, or None) at `revision`."""
        plan = self._plans.get(scope)
        if plan is not None and plan.revision == revision:
            self._plans.move_to_end(scope)
            return plan
        plan = self._make_plan(scope, revision, include_runtime_context)
        self._plans[scope] = plan
        if len(self._plans) > _PLANS_KEPT:
            self._plans.popitem(last=False)
        return plan

    def _make_plan(self, scope: str | None, revision: int, include_runtime_context: bool) -> Plan:
        chain = self._scopes.chain(scope)
        layers = self._layers.along(chain)
        return plan_of(
            revision,
            chain,
            layers,
            include_runtime_context,
            self._listeners.admitted(chain),
        )
