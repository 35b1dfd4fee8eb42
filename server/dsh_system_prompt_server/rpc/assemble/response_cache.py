"""Encoded Assemble responses of static and all-cacheable plans, kept as bytes, bounded;
the policy that says which responses may be reused (`reuse_key`); and the index from a
request's own bytes to its kept response (`by_request`), which answers a repeated
request before it is parsed."""

from __future__ import annotations

import sys
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from typing import NamedTuple

from ...registry import AssembleContext, Plan, context_key

# (scope, chain revision, render, ...): `reuse_key`'s, which says when a response is reusable.
Key = Hashable
MAX_BYTES = 32 * 1024 * 1024  # limits.max_response_cache_bytes
_ENTRY_BYTES = 200  # the key tuple, the dict slot and the bytes object's header
# A response is indexed by at most this many requests' bytes, each at most this long, so
# requests that vary only in what a static plan ignores (its fields) cannot push every
# other kept answer out of the shared bound; the rest are answered after parsing.
MAX_INDEXED_PER_RESPONSE = 16
MAX_INDEXED_REQUEST_BYTES = 4096


class Stamp(NamedTuple):
    """What a kept response was built from, beyond the request: the scope keys it read (the
    request's own, which may not be known yet, and the plan's chain) and their revision
    (`Registry.chain_revision`), and for a plan with callbacks the callback cache's
    generation (None: a static plan)."""

    keys: tuple[str, ...]
    revision: int
    generation: int | None
    reach: int  # the registry's reach_epoch: a credential narrowed remakes plans, no revision


class _Indexed(NamedTuple):
    """A request's bytes indexed: the response's key, and when it holds."""

    key: Key
    stamp: Stamp


def reuse_key(plan: Plan, context: AssembleContext, render: bool, generation: int) -> Key | None:
    """What a response is kept under: a static plan's by its chain's revision (not by the
    caller's scope key: that is not kept); a plan whose every callback may be cached
    also by the callback cache's `generation` (and the context, if an answer depends on
    it); None when the response cannot be reused (a callback asked every time, or one
    whose answers expire: those are reused, but the assembly is rebuilt)."""
    if plan.out_of_reach:
        # Its answer names what it passed over (never kept), and its key would be the
        # full plan's: a plan of the same scope and revision with those callbacks in.
        return None
    if plan.is_static:
        return (plan.scope, plan.revision, render)
    policy = plan.policy
    if policy is None or policy.ttl_s is not None:
        return None
    return (plan.scope, plan.revision, render, generation, context_key(policy, context))


class ResponseCache:
    """The last reusable responses, at most `size` entries and `max_bytes` together,
    least recently used dropped first.

    Two kinds of entries share the bound: a response under its `reuse_key`, and a
    request's bytes indexing it (`index`: a few short ones per response), which count
    their own bytes (the response is counted once, under its key). Keys carry the chain's
    revision, so a change to what a scope is made of makes its older entries unreachable
    (and only its: another scope's change leaves them be); they age out as new ones come in.
    """

    def __init__(self, size: int = 2048, max_bytes: int = MAX_BYTES) -> None:
        self._size = size
        self.max_bytes = max_bytes  # a reload may change it; it applies from the next put
        self.bytes = 0  # what the kept responses take, keys included
        self._entries: OrderedDict[Key, tuple[bytes | _Indexed, int]] = OrderedDict()
        self._indexed: Counter[Key] = Counter()  # index entries per response key

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> bytes | None:
        kept = self._entries.get(key)
        if kept is None or not isinstance(kept[0], bytes):
            return None
        self._entries.move_to_end(key)
        return kept[0]

    def by_request(
        self,
        request: bytes,
        revision: Callable[[tuple[str, ...]], int],
        generation: int,
        reach: int,
    ) -> bytes | None:
        """The response kept for these exact request bytes, if it still holds: the scope
        keys it read are at the revision it was built at (`revision` gives theirs now), and
        for a plan with callbacks the callback cache is at the same `generation`, and no
        owner's reach was bound anew since (`reach`, the registry's reach_epoch)."""
        kept = self._entries.get(request)
        indexed = None if kept is None else kept[0]
        if not isinstance(indexed, _Indexed):
            return None
        stamp = indexed.stamp
        if stamp.generation not in (None, generation) or stamp.reach != reach:
            return None
        if revision(stamp.keys) != stamp.revision:
            return None
        self._entries.move_to_end(request)
        return self.get(indexed.key)

    def put(self, key: Key, response: bytes) -> None:
        self._keep(key, response, len(response) + _key_bytes(key))

    def index(self, request: bytes, key: Key, stamp: Stamp) -> None:
        """Answer `request`'s bytes with the response kept under `key` while `stamp` holds."""
        if key not in self._entries:  # the response itself was too large to keep
            return
        if len(request) > MAX_INDEXED_REQUEST_BYTES:
            return
        if request not in self._entries and self._indexed[key] >= MAX_INDEXED_PER_RESPONSE:
            return
        self._keep(request, _Indexed(key, stamp), sys.getsizeof(request) + _ENTRY_BYTES)

    def _keep(self, key: Key, kept: bytes | _Indexed, size: int) -> None:
        if size > self.max_bytes:
            return  # larger than the whole budget: built again each time, never kept
        self._drop(key)
        self._entries[key] = (kept, size)
        self.bytes += size
        if isinstance(kept, _Indexed):
            self._indexed[kept.key] += 1
        while len(self._entries) > self._size or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))  # the least recently used

    def _drop(self, key: Key) -> None:
        kept = self._entries.pop(key, None)
        if kept is None:
            return
        self.bytes -= kept[1]
        if isinstance(kept[0], _Indexed):
            self._indexed[kept[0].key] -= 1
            if self._indexed[kept[0].key] <= 0:
                del self._indexed[kept[0].key]


def _key_bytes(key: Key) -> int:
    """A key's strings (a scope key, a context's fields) count against the budget too."""
    if isinstance(key, str):
        return sys.getsizeof(key)
    if not isinstance(key, tuple):
        return 0
    size = _ENTRY_BYTES
    for part in key:  # a context key nests (scope, fields_json): only a tuple is gone into
        if isinstance(part, str):
            size += sys.getsizeof(part)
        elif isinstance(part, tuple):
            size += _key_bytes(part)
    return size
