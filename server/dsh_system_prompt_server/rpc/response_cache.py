"""Encoded Assemble responses of static and all-cacheable plans, kept as bytes, bounded."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

# (scope, revision, render, ...): the service's `_response_key`, which says when one is reusable.
Key = Hashable


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
