"""Answers of callbacks that declared they can be cached (docs/protocol.md, "Cacheable
callbacks"): a provider's value, or the result of a waterfall's cacheable tail.

Everything kept is for the revision of the assembly's scope chain (its plan's,
registry/revisions.py): any registration, disposal, update, listener added or removed,
or session end (which disposes) in a layer the assembly reads (its scope's, its
ancestors', the global one) makes it unreachable, and a change in any other scope
leaves it be. Unreachable entries go as the least recently used. A callback's owner may drop its own
answers at any time (`invalidate`); `generation` then moves, so answers being
computed while it happened are not kept, and callers may key their own caches by it.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

from ..limits import value_bytes
from ..model import AssembleContext, Assembly, CachePolicy, ProvidedValue

MAX_KEPT = 1024  # answers and waterfall results together; the oldest used go first
MAX_BYTES = 32 * 1024 * 1024  # what they take together (limits.max_callback_cache_bytes)
_ENTRY_BYTES = 400  # an entry's own objects: key tuple, record, dict slot


@dataclass(frozen=True, slots=True)
class _Kept:
    owners: tuple[str, ...]  # the registration ids whose invalidation drops it
    value: object
    expires: float  # clock time; inf without a time to live
    given: Assembly | None = None  # a waterfall's input the result is for
    size: int = 0  # bytes it takes, key included, against the cache's byte bound


class _Missing:
    pass


MISSING = _Missing()


def context_key(policy: CachePolicy, context: AssembleContext) -> Hashable:
    """The part of the assemble context an answer under `policy` is kept by (None:
    it does not depend on the context)."""
    return (context.scope, context.fields_json) if policy.by_context else None


class CallbackCache:
    """Cached callback answers by their chain's revision, bounded in number and in bytes."""

    def __init__(
        self,
        max_kept: int = MAX_KEPT,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self._max_kept = max_kept
        self.max_bytes = max_bytes  # a reload may change it; it applies from the next answer
        self._clock = clock
        self._kept: OrderedDict[Hashable, _Kept] = OrderedDict()
        self.bytes = 0  # what the kept entries take
        self.generation = 0  # moves at every invalidation

    def __len__(self) -> int:
        return len(self._kept)

    def answer(
        self, entry_id: str, policy: CachePolicy, context: AssembleContext, revision: int
    ) -> ProvidedValue | _Missing:
        """A provider's kept answer for `context` at the chain's `revision`, or MISSING."""
        kept = self._get(_key("answer", entry_id, policy, context, revision))
        return MISSING if kept is None else kept.value  # type: ignore[return-value]

    def keep_answer(
        self,
        entry_id: str,
        policy: CachePolicy,
        context: AssembleContext,
        revision: int,
        generation: int,
        value: ProvidedValue,
    ) -> None:
        """Keep a provider's answer, unless an invalidation came since `generation`."""
        key = _key("answer", entry_id, policy, context, revision)
        self._put(key, generation, policy, context, (entry_id,), value, size=_value_bytes(value))

    def result(
        self,
        listener_ids: tuple[str, ...],
        policy: CachePolicy,
        context: AssembleContext,
        revision: int,
        given: Assembly,
    ) -> Assembly | None:
        """The kept result of the listeners `listener_ids` (a waterfall's tail) for the
        input `given`, or None; a copy, the caller may change it."""
        kept = self._get(_key("waterfall", listener_ids, policy, context, revision))
        if kept is None or kept.given != given:
            return None
        assert isinstance(kept.value, Assembly)
        return kept.value.copy()

    def keep_result(
        self,
        listener_ids: tuple[str, ...],
        policy: CachePolicy,
        context: AssembleContext,
        revision: int,
        generation: int,
        given: Assembly,
        result: Assembly,
    ) -> None:
        key = _key("waterfall", listener_ids, policy, context, revision)
        size = _assembly_bytes(given) + _assembly_bytes(result)
        self._put(key, generation, policy, context, listener_ids, result.copy(), given.copy(), size)

    def invalidate(self, registration_ids: Iterable[str]) -> None:
        """Drop every answer of these registrations (and results that include them)."""
        self.generation += 1
        ids = set(registration_ids)
        for key in [k for k, kept in self._kept.items() if ids.intersection(kept.owners)]:
            self._drop(key)

    def _get(self, key: Hashable) -> _Kept | None:
        kept = self._kept.get(key)
        if kept is None:
            return None
        if kept.expires <= self._clock():
            self._drop(key)
            return None
        self._kept.move_to_end(key)
        return kept

    def _put(
        self,
        key: Hashable,
        generation: int,
        policy: CachePolicy,
        context: AssembleContext,
        owners: tuple[str, ...],
        value: object,
        given: Assembly | None = None,
        size: int = 0,
    ) -> None:
        """Keep `value` (of `size` bytes, its key counted here) as `policy` says."""
        # A change while it was computed leaves it under its plan's older revision, which
        # no later plan asks for: it ages out unused.
        if generation != self.generation:
            return  # invalidated while it was computed
        kept = _Kept(owners, value, self._expiry(policy), given, _key_bytes(context) + size)
        if kept.size > self.max_bytes:
            return  # more than the whole budget: asked again next time, never kept
        self._drop(key)
        self._kept[key] = kept
        self.bytes += kept.size
        while len(self._kept) > self._max_kept or self.bytes > self.max_bytes:
            self._drop(next(iter(self._kept)))  # the least recently used

    def _drop(self, key: Hashable) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept.size

    def _expiry(self, policy: CachePolicy) -> float:
        return float("inf") if policy.ttl_s is None else self._clock() + policy.ttl_s


def combined(policies: Sequence[CachePolicy]) -> CachePolicy:
    """The policy of a result several callbacks made: the context if any depends on it,
    the shortest time to live."""
    ttls = [policy.ttl_s for policy in policies if policy.ttl_s is not None]
    return CachePolicy(
        by_context=any(policy.by_context for policy in policies),
        ttl_s=min(ttls) if ttls else None,
    )


def _key(
    kind: str, whose: Hashable, policy: CachePolicy, context: AssembleContext, revision: int
) -> Hashable:
    """Where an answer (`kind` "answer", a provider's id) or a waterfall's result ("waterfall",
    its listeners' ids) is kept and looked up."""
    return (kind, whose, context_key(policy, context), revision)


def _key_bytes(context: AssembleContext) -> int:
    """The context an entry may be kept by (its fields are bounded by max_fields_bytes)."""
    return _ENTRY_BYTES + sys.getsizeof(context.fields_json) + sys.getsizeof(context.scope)


def _value_bytes(value: ProvidedValue) -> int:
    if isinstance(value, str):
        return sys.getsizeof(value)
    return 2 * value_bytes(value) + 64  # tools: their strings and objects; None: the slot


def _assembly_bytes(assembly: Assembly) -> int:
    """Its texts and tools as if none were shared with the registry (a listener's are not)."""
    parts = sum(
        sys.getsizeof(part.name) + sys.getsizeof(part.text) + 64
        for part in (*assembly.sections, *assembly.contexts)
    )
    tools = sum(
        sys.getsizeof(t.name) + sys.getsizeof(t.description) + sys.getsizeof(t.parameters_json)
        for t in assembly.tools
    )
    variables = sum(sys.getsizeof(v) + sys.getsizeof(k) for k, v in assembly.variables.items())
    return parts + tools + variables
