"""Watches and listings: change streams that resume, registry listings, live prompts.

Every response names the sidecar's incarnation (a random id per process), so
a subscriber knows when revisions start again. Each watch costs only its own
caller: its buffer is bounded, its filter runs on its own events, and a
prompt watch rebuilds the prompt once per burst of changes, at its own pace.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from .cache_report import Layout
from .convert import change_to_proto, filter_from_proto, layout_from_proto, registration_to_proto
from .peers import PeerCounts
from .prompt_watch import PromptWatch
from .registry import Filter, Registry, Subscription
from .registry.limits import quota_exceeded
from .tokens import Tokenizer

_BATCH_COUNT = 256  # registrations per listing message
_BATCH_BYTES = 1024 * 1024  # values per listing message, roughly (one value may be more)


@dataclass(frozen=True)
class WatchSettings:
    """The config of watches: buffers, history is the registry's, bounds per peer."""

    buffer: int  # events queued per watcher before it is told it missed some
    max_watchers: int
    max_per_peer: int
    coalesce_s: float  # how long a prompt watch waits for a burst of changes to end
    layout: Layout  # the default prefix layout of prompt reports


class Watches:
    """The sidecar's change watches, listings and prompt watches."""

    def __init__(
        self,
        registry: Registry,
        settings: WatchSettings,
        owner_name: Callable[[str], str],
        tokenizer: Tokenizer | None,
    ) -> None:
        self.incarnation = secrets.token_hex(8)
        self._registry = registry
        self._settings = settings
        self._owner_name = owner_name
        self._tokenizer = tokenizer
        self._per_peer = PeerCounts(
            settings.max_per_peer, "watches", "limits.max_watchers_per_peer"
        )

    def reconfigure(self, settings: WatchSettings) -> None:
        """Take reloaded settings; watches already open keep their buffer."""
        self._settings = settings
        self._per_peer.limit = settings.max_per_peer

    # -- change events ----------------------------------------------------------------

    def subscribe(self, request: pb.WatchChangesRequest) -> Subscription:
        """Subscribe as `request` asks: from now, or resuming after a revision."""
        wanted = filter_from_proto(request.filter, self._registry.limits)
        keeps = self._registry.keeps(wanted)
        after = request.after_revision if request.HasField("after_revision") else None
        if after is not None and request.incarnation not in ("", self.incarnation):
            after = -1  # another incarnation's revision: nothing of it can be replayed
        return self._registry.changes.subscribe(
            self._settings.buffer,
            after=after,
            accepts=lambda event: keeps(event.kind, event.scope),
        )

    async def changes(
        self, subscription: Subscription
    ) -> AsyncGenerator[pb.WatchChangesResponse, None]:
        """The stream of one subscription: confirmation, replayed events, then live ones."""
        subscribed = pb.WatchSubscribed(
            revision=subscription.revision,
            incarnation=self.incarnation,
            resync=subscription.resync,
        )
        yield pb.WatchChangesResponse(subscribed=subscribed, incarnation=self.incarnation)
        while True:
            response = change_to_proto(await subscription.next())
            response.incarnation = self.incarnation
            yield response

    # -- listings ---------------------------------------------------------------------

    def listing(self, request: pb.ListRegistrationsRequest) -> list[pb.ListRegistrationsResponse]:
        """The registrations `request` asks for, in batches, all taken at one revision."""
        wanted = filter_from_proto(request.filter, self._registry.limits)
        entries = self._registry.listing(wanted)
        revision = self._registry.revision
        batches = [self._batch(revision)]
        size = 0
        for entry in entries:
            info = registration_to_proto(
                entry, self._owner_name(entry.owner), request.include_values
            )
            size += info.ByteSize() if request.include_values else 0
            if len(batches[-1].registrations) >= _BATCH_COUNT or size > _BATCH_BYTES:
                batches.append(self._batch(revision))
                size = info.ByteSize() if request.include_values else 0
            batches[-1].registrations.append(info)
        return batches

    def _batch(self, revision: int) -> pb.ListRegistrationsResponse:
        return pb.ListRegistrationsResponse(revision=revision, incarnation=self.incarnation)

    # -- live prompts -----------------------------------------------------------------

    def prompt_watch(self, request: pb.WatchPromptRequest) -> tuple[PromptWatch, Subscription]:
        """A prompt watch of the request's scope and the change subscription that drives it."""
        scope = request.scope or None
        self._registry.limits.check_name("scope", request.scope)
        keeps = self._registry.keeps(Filter(scope, ancestors=True))
        subscription = self._registry.changes.subscribe(
            self._settings.buffer, accepts=lambda event: keeps(event.kind, event.scope)
        )
        layout = layout_from_proto(request.prefix_layout, self._settings.layout)
        watch = PromptWatch(
            self._registry, scope, request.render, layout, self._tokenizer, self.incarnation
        )
        return watch, subscription

    async def prompts(
        self, watch: PromptWatch, subscription: Subscription
    ) -> AsyncGenerator[pb.WatchPromptResponse, None]:
        """The prompt now, then again after each burst of changes that affects it."""
        yield await watch.prompt()
        while True:
            burst: list[Any] = [await subscription.next()]
            await asyncio.sleep(self._settings.coalesce_s)
            while (item := subscription.poll()) is not None:
                burst.append(item)
            yield await watch.prompt(burst)

    # -- bounds -----------------------------------------------------------------------

    def admit(self, peer: str) -> None:
        """Count one more watch of `peer`: QUOTA_EXCEEDED past the sidecar's or the peer's bound."""
        watchers = self._registry.changes.subscriber_count()
        if watchers >= self._settings.max_watchers:
            raise quota_exceeded(f"the sidecar already has {watchers} watchers, its limit")
        self._per_peer.admit(peer)

    def release(self, peer: str) -> None:
        """One watch of `peer` ended."""
        self._per_peer.release(peer)
