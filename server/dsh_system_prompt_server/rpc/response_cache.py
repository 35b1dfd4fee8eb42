"""Encoded Assemble responses of static and all-cacheable plans, kept as bytes, bounded;
and the policy that says which responses may be reused (`reuse_key`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from ..registry import AssembleContext
from ..registry.assembly import Plan
from ..registry.callback_cache import context_key

# (scope, revision, render, ...): `reuse_key`'s, which says when a response is reusable.
Key = Hashable


def reuse_key(plan: Plan, context: AssembleContext, render: bool, generation: int) -> Key | None:
    """What a response is kept under: a static plan's by its revision (not by the
    caller's scope key: that is not kept); a plan whose every callback may be cached
    also by the callback cache's `generation` (and the context, if an answer depends on
    it); None when the response cannot be reused (a callback asked every time, or one
    whose answers expire: those are reused, but the assembly is rebuilt)."""
    if plan.is_static:
        return (plan.scope, plan.revision, render)
    policy = plan.policy
    if policy is None or policy.ttl_s is not None:
        return None
    return (plan.scope, plan.revision, render, generation, context_key(policy, context))


class ResponseCache:
    """The last `size` reusable responses, least recently used dropped first.

    Keys carry the revision, so a change makes older entries unreachable; they
    age out as new ones come in.
    """

    def __init__(self, size: int = 2048) -> None:
        self._size = size
        self._responses: OrderedDict[Key, bytes] = OrderedDict()

    def get(self, key: Key) -> bytes | None:
        response = self._responses.get(key)
        if response is not None:
            self._responses.move_to_end(key)
        return response

    def put(self, key: Key, response: bytes) -> None:
        self._responses[key] = response
        self._responses.move_to_end(key)
        if len(self._responses) > self._size:
            self._responses.popitem(last=False)
