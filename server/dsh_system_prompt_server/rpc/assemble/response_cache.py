"""Encoded Assemble responses of static and all-cacheable plans, kept as bytes, bounded;
and the policy that says which responses may be reused (`reuse_key`)."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable

from ...registry import AssembleContext
from ...registry.assembly.plan import Plan
from ...registry.callbacks.cache import context_key

# (scope, revision, render, ...): `reuse_key`'s, which says when a response is reusable.
Key = Hashable
MAX_BYTES = 32 * 1024 * 1024  # limits.max_response_cache_bytes
_ENTRY_BYTES = 200  # the key tuple, the dict slot and the bytes object's header


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
    """The last reusable responses, at most `size` of them and `max_bytes` together,
    least recently used dropped first.

    Keys carry the revision, so a change makes older entries unreachable; they
    age out as new ones come in.
    """

    def __init__(self, size: int = 2048, max_bytes: int = MAX_BYTES) -> None:
        self._size = size
        self.max_bytes = max_bytes  # a reload may change it; it applies from the next put
        self.bytes = 0  # what the kept responses take, keys included
        self._responses: OrderedDict[Key, tuple[bytes, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def get(self, key: Key) -> bytes | None:
        kept = self._responses.get(key)
        if kept is None:
            return None
        self._responses.move_to_end(key)
        return kept[0]

    def put(self, key: Key, response: bytes) -> None:
        size = len(response) + _key_bytes(key)
        if size > self.max_bytes:
            return  # larger than the whole budget: built again each time, never kept
        self._drop(key)
        self._responses[key] = (response, size)
        self.bytes += size
        while len(self._responses) > self._size or self.bytes > self.max_bytes:
            self._drop(next(iter(self._responses)))  # the least recently used

    def _drop(self, key: Key) -> None:
        kept = self._responses.pop(key, None)
        if kept is not None:
            self.bytes -= kept[1]


def _key_bytes(key: Key) -> int:
    """A key's strings (a scope key, a context's fields) count against the budget too."""
    if isinstance(key, str):
        return sys.getsizeof(key)
    if isinstance(key, tuple):  # a context key nests (scope, fields_json)
        return _ENTRY_BYTES + sum(_key_bytes(part) for part in key)
    return 0
