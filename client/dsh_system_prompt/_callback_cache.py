"""Cacheable callbacks on the client's side: the policies a provider or listener
declares, and cache invalidations awaiting the sidecar's confirmation on a stream."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from .errors import NoAnswer


@dataclass(frozen=True)
class Cache:
    """What a provider's answer (or a listener's result, for its input) depends on, so
    the sidecar may reuse it instead of asking (docs/protocol.md, "Cacheable callbacks").

    `Cache.REVISION`: nothing but the registry's revision. `Cache.FIELDS`: the assemble
    context too (its scope and fields). `Cache.ttl(s)`: either, reused for at most `s`
    seconds. Any registry change drops every cached answer; `await handle.invalidate()`
    drops the callback's own. Without `cache=`, a callback is asked at every assembly.
    """

    fields: bool = False
    ttl_s: float | None = None

    REVISION: ClassVar[Cache]
    FIELDS: ClassVar[Cache]

    @staticmethod
    def ttl(seconds: float, *, fields: bool = False) -> Cache:
        """Reused for at most `seconds` (and, with `fields`, per assemble context)."""
        if not seconds > 0:
            raise ValueError(f"a time to live must be a positive number of seconds, not {seconds}")
        return Cache(fields=fields, ttl_s=float(seconds))

    def to_proto(self) -> pb.CachePolicy:
        depends_on = pb.CACHE_DEPENDENCY_CONTEXT if self.fields else pb.CACHE_DEPENDENCY_REVISION
        return pb.CachePolicy(depends_on=depends_on, ttl_s=self.ttl_s or 0.0)


Cache.REVISION = Cache()
Cache.FIELDS = Cache(fields=True)


class Invalidations:
    """The invalidations sent on one stream that the sidecar has not confirmed yet."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[None]] = {}

    async def invalidate(
        self,
        send: Callable[[pb.CacheInvalidate], Awaitable[None]],
        timeout: float,
        provider_keys: Iterable[str] = (),
    ) -> None:
        """Send one invalidation and wait until the sidecar says it is done (or the
        stream ends: then nothing it registered is cached any more)."""
        invalidate_id = next(self._ids)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[invalidate_id] = done
        request = pb.CacheInvalidate(invalidate_id=invalidate_id, provider_keys=provider_keys)
        try:
            async with asyncio.timeout(timeout):
                try:
                    await send(request)
                except (grpc.RpcError, asyncio.InvalidStateError):
                    return  # the stream is ending: its registrations go with it
                await done
        except TimeoutError:
            raise NoAnswer("a cache invalidation", timeout) from None
        finally:
            self._waiting.pop(invalidate_id, None)

    def confirmed(self, invalidate_id: int) -> None:
        waiting = self._waiting.get(invalidate_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def release(self) -> None:
        """The stream ended: what it registered is disposed, so nothing of it is cached."""
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_result(None)
