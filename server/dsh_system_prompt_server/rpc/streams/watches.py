"""Watches and listings: change streams that resume, registry listings, live prompts.

Every response names the sidecar's incarnation (a random id per process), so
a subscriber knows when revisions start again. Each watch costs only its own
caller: its buffer is bounded, its filter runs on its own events, and a
prompt watch rebuilds the prompt once per burst of changes, at its own pace.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from google.protobuf.message import Message

from ...guard import Gate, Shares, client_of, sees_values, share_key, shown_steps, wire_s
from ...registry import (
    STEPS,
    AnyRegistration,
    ChangeEvent,
    Client,
    ClientCounts,
    Filter,
    Kind,
    Missed,
    Registry,
    Subscription,
    anonymous,
    quota_exceeded,
)
from ...reports import Layout, Tokenizer
from ...telemetry import Metrics
from ...wire import (
    anonymous_registration,
    batch_entry,
    batch_to_proto,
    change_to_proto,
    filter_from_proto,
    layout_from_proto,
    registration_to_proto,
)
from .broker import Stream, stalled, write_all
from .in_flight import InFlight
from .outbox import Outbox, OutboxLimits
from .prompt_pace import PromptPace
from .prompt_watch import PromptWatch, ScopePrompt
from .turns import Turns

_BATCH_COUNT = 256  # registrations per listing message
_BATCH_BYTES = 1024 * 1024  # values per listing message, roughly (one value may be more)
CHANGE_BATCHES = "change-batches"  # the watch feature: pending events go in one ChangeBatch
FEATURES = frozenset({CHANGE_BATCHES})  # the watch features this sidecar implements
_ENCODED_EVENTS = 4096  # recent events kept encoded for the watchers still to send them
MAX_BATCH_EVENTS = 512  # events per ChangeBatch (each event is bounded by the name limits)


Change = ChangeEvent | Missed  # what a change subscription reads
Shows = Callable[[str | None], bool]  # which layers' steps a caller is shown by name
Written = Message | bytes  # what a watch writes: a message, or a prompt encoded once for all
Opened = TypeVar("Opened")


@dataclass(frozen=True)
class WatchSettings:
    """The config of watches: buffers, history is the registry's, bounds per client."""

    watch_buffer: int  # events queued per watcher before it is told it missed some
    watch_lag_s: float  # how long an event may wait for a change watcher (0: no bound)
    max_watchers: int
    max_watchers_per_peer: int
    prompt_coalesce_s: float  # how long a prompt watch waits for a burst of changes to end
    watch_coalesce_s: float  # how long a batching change watch gathers a burst of changes
    prefix_layout: Layout  # the default prefix layout of prompt reports
    prompt_bytes: int  # prompt messages being written, all watchers together
    prompt_bytes_per_s: int  # prompt bytes written per second, all watchers together (0: any)


class Watches:
    """The sidecar's change watches, listings and prompt watches."""

    def __init__(
        self,
        registry: Registry,
        settings: WatchSettings,
        owner_name: Callable[[str], str],
        tokenizer: Tokenizer | None,
        metrics: Metrics,
        shares: Shares,
    ) -> None:
        self.incarnation = secrets.token_hex(8)
        self._registry = registry
        self._metrics = metrics
        self._settings = settings
        self._owner_name = owner_name
        self._tokenizer = tokenizer
        self._shares = shares  # a watcher over its client's share of the loop writes later
        self.turns = Turns()  # a few watch writes at once: callers never queue behind many
        self.prompts_in_flight = InFlight(settings.prompt_bytes)
        self.prompt_pace = PromptPace(settings.prompt_bytes_per_s)
        self._entries: dict[int, bytes] = {}  # revision -> its event encoded, the latest ones
        self._shown: dict[tuple[str | None, bool, Layout], ScopePrompt] = {}  # shared prompts
        self._per_client = ClientCounts(
            settings.max_watchers_per_peer, "watches", "limits.max_watchers_per_peer"
        )

    def reconfigure(self, settings: WatchSettings) -> None:
        """Take reloaded settings; watches already open keep their buffer."""
        self._settings = settings
        self._per_client.limit = settings.max_watchers_per_peer
        self.prompts_in_flight.resize(settings.prompt_bytes)  # waiters that now fit go
        self.prompt_pace.resize(settings.prompt_bytes_per_s)

    # -- the streams ------------------------------------------------------------------

    async def serve_changes(
        self, request: pb.WatchChangesRequest, stream: Stream[Written], gate: Gate
    ) -> None:
        """Serve one WatchChanges stream until its peer stops reading it."""
        client = client_of(stream.peer())
        subscription = self._open(client, gate, lambda: self.subscribe(request))
        responses = self.changes(subscription, request.features, client, shown_steps())
        await self._serve(stream, client, subscription, responses)

    async def serve_prompts(
        self, request: pb.WatchPromptRequest, stream: Stream[Written], gate: Gate
    ) -> None:
        """Serve one WatchPrompt stream until its peer stops reading it."""
        client = client_of(stream.peer())
        watch, subscription = self._open(client, gate, lambda: self.prompt_watch(request))
        prompts = self.prompts(watch, subscription, client, shown_steps())
        await self._serve(stream, client, subscription, prompts)

    def _open(self, client: Client | None, gate: Gate, start: Callable[[], Opened]) -> Opened:
        """Admit one more watch of `client` and start it; nothing is held if it fails."""
        gate.check()
        self.admit(client)
        try:
            return start()
        except BaseException:
            self.release(client)
            raise

    async def _serve(
        self,
        stream: Stream[Written],
        client: Client | None,
        subscription: Subscription,
        responses: AsyncGenerator[Message, None] | AsyncGenerator[bytes, None],
    ) -> None:
        """Write a watch's responses, each once the one before is written, until its peer
        stops taking them (then close it): STREAM_STALLED, raised, ends the call."""
        try:
            limits = OutboxLimits(write_timeout_s=self._registry.settings.provider_timeout_s)
            outbox: Outbox[Message] = Outbox(stream.write, limits, "the watcher")
            await write_all(outbox, responses)
        finally:  # however it ends: cancelled, its peer gone, stalled
            subscription.close()
            self.release(client)
        if outbox.stalled.is_set():
            raise stalled(self._metrics, "watcher", stream.peer(), outbox)

    async def serve_listing(
        self, request: pb.ListRegistrationsRequest, stream: Stream[Written], gate: Gate
    ) -> None:
        """Serve one ListRegistrations call: each batch is built once the one before it was
        written, and one not written within provider_timeout_s ends the call STREAM_STALLED."""
        with gate.call():
            batches = self.listing(request)
        limits = OutboxLimits(write_timeout_s=self._registry.settings.provider_timeout_s)
        outbox: Outbox[Message] = Outbox(stream.write, limits, "the listing")
        for batch in batches:
            if not await outbox.write(batch):
                raise stalled(self._metrics, "listing", stream.peer(), outbox)

    # -- change events ----------------------------------------------------------------

    def subscribe(self, request: pb.WatchChangesRequest) -> Subscription:
        """Subscribe as `request` asks: from now, or resuming after a revision."""
        self._registry.limits.check_count("watch features", len(request.features))
        wanted = filter_from_proto(request.filter, self._registry.limits)
        keeps = self._registry.keeps(wanted)
        after = request.after_revision if request.HasField("after_revision") else None
        if after is not None and request.incarnation not in ("", self.incarnation):
            after = -1  # another incarnation's revision: nothing of it can be replayed
        every = wanted == Filter()  # no filter: no test per event, on every watcher's every event
        # A batching watcher's backlog goes in one message at its next turn, cheaper than the
        # listing it would make after a gap: only one taking a message per event has a lag bound.
        lags = CHANGE_BATCHES not in request.features and self._settings.watch_lag_s
        return self._registry.changes.subscribe(
            self._settings.watch_buffer,
            after=after,
            accepts=None if every else lambda event: _kept(keeps, event),
            max_lag_s=lags or None,
        )

    async def changes(
        self,
        subscription: Subscription,
        features: Iterable[str],
        client: Client | None,
        shows: Shows | None = None,
    ) -> AsyncGenerator[pb.WatchChangesResponse, None]:
        """The stream of one subscription: confirmation, replayed events, then live ones.

        With `change-batches` in effect, every event pending for the watcher
        goes in one message, gathered for `watch_coalesce_s` after the first:
        a burst of changes costs each watcher one write, not one per change. A
        watcher over `client`'s share of the loop writes later. A step held in a layer
        `shows` does not name (the caller's credential does not list it) is sent
        anonymous, as the caller's listing shows it.
        """
        in_effect = sorted(FEATURES.intersection(features))
        subscribed = pb.WatchSubscribed(
            revision=subscription.revision,
            incarnation=self.incarnation,
            resync=subscription.resync,
            features=in_effect,
        )
        yield pb.WatchChangesResponse(subscribed=subscribed, incarnation=self.incarnation)
        batches, sharer = CHANGE_BATCHES in in_effect, share_key(client)
        encoded = self._encoded if shows is None else self._shown_by(shows)
        # more pending than one turn carries: it waits apart from the watchers that keep up
        backlog = MAX_BATCH_EVENTS - 1 if batches else 0
        while True:
            first = await subscription.next()
            if batches and not isinstance(first, Missed) and self._settings.watch_coalesce_s:
                await asyncio.sleep(self._settings.watch_coalesce_s)  # gather the burst
            await self._shares.turn(sharer)  # what comes meanwhile goes in the same batch
            turn = await self.turns.take(behind=subscription.unread() > backlog)
            try:
                if batches:  # what is pending at the turn goes now: a long wait, a big batch
                    response = batch_to_proto(_burst(subscription, first), encoded)
                    response.incarnation = self.incarnation
                    turn.spent(response.ByteSize())
                    yield response  # the consumer writes it before it asks for the next
                    continue
                # A plain watcher gets its events one message each, as many as its turn
                # takes; the rest wait in its subscription, where they count against its
                # buffer and its lag, so that one that cannot keep up is told at once.
                item: Change | None = first
                while item is not None:
                    response = change_to_proto(_shown(item, shows))
                    response.incarnation = self.incarnation
                    turn.spent(response.ByteSize())
                    yield response
                    item = None if turn.over else subscription.poll()
            finally:
                turn.done()

    def _shown_by(self, shows: Shows) -> Callable[[ChangeEvent], bytes]:
        """The batch entries of a caller shown only the steps of the layers `shows` names."""

        def encoded(event: ChangeEvent) -> bytes:
            if event.kind not in STEPS or shows(event.scope):
                return self._encoded(event)
            return batch_entry(anonymous(event))

        return encoded

    def _encoded(self, event: ChangeEvent) -> bytes:
        """`event` as a ChangeBatch entry, encoded once for every watcher that sends it."""
        entry = self._entries.get(event.revision)
        if entry is None:
            entry = self._entries[event.revision] = batch_entry(event)
            if len(self._entries) > _ENCODED_EVENTS:
                del self._entries[next(iter(self._entries))]  # the oldest revision
        return entry

    # -- listings ---------------------------------------------------------------------

    def listing(
        self, request: pb.ListRegistrationsRequest
    ) -> Iterator[pb.ListRegistrationsResponse]:
        """The registrations `request` asks for, in batches, all taken at one revision.

        The filter is checked and the registrations are taken now; each batch is built
        only when the one before it was sent, so a listing that is not read holds one
        batch, not a copy of every value.
        """
        wanted = filter_from_proto(request.filter, self._registry.limits)
        entries = self._registry.listing(wanted)
        # taken in the call's context, asked as batches are built: a reload's grants reach them
        sizes, shows = sees_values(), shown_steps()
        revision = self._registry.revision
        return self._batches(entries, revision, request.include_values, sizes, shows)

    def _batches(
        self,
        entries: list[AnyRegistration],
        revision: int,
        with_values: bool,
        sizes: Callable[[], bool],
        shows: Shows | None,
    ) -> Iterator[pb.ListRegistrationsResponse]:
        def info_of(entry: AnyRegistration) -> pb.RegistrationInfo:
            if shows is not None and entry.kind in STEPS and not shows(entry.scope):
                return anonymous_registration(entry)  # as the caller's watch shows its events
            owner = self._owner_name(entry.owner)
            return registration_to_proto(entry, owner, with_values, sizes())

        batch, size = self._batch(revision), 0
        for entry in entries:
            info = info_of(entry)
            size += info.ByteSize() if with_values else 0
            if len(batch.registrations) >= _BATCH_COUNT or size > _BATCH_BYTES:
                yield batch
                # shown again once that batch was taken: a reload meanwhile reaches it too
                info = info_of(entry)
                batch, size = self._batch(revision), info.ByteSize() if with_values else 0
            batch.registrations.append(info)
        yield batch

    def _batch(self, revision: int) -> pb.ListRegistrationsResponse:
        return pb.ListRegistrationsResponse(revision=revision, incarnation=self.incarnation)

    # -- live prompts -----------------------------------------------------------------

    def prompt_watch(self, request: pb.WatchPromptRequest) -> tuple[PromptWatch, Subscription]:
        """A prompt watch of the request's scope and the change subscription that drives it;
        watchers asking for the same scope, render and layout share one prompt."""
        scope = request.scope or None
        self._registry.limits.check_name("scope", request.scope)
        keeps = self._registry.keeps(Filter(scope, ancestors=True))
        subscription = self._registry.changes.subscribe(
            self._settings.watch_buffer, accepts=lambda event: _kept(keeps, event)
        )
        layout = layout_from_proto(request.prefix_layout, self._settings.prefix_layout)
        key = (scope, request.render, layout)
        shown = self._shown.get(key)
        if shown is None:
            shown = self._shown[key] = ScopePrompt(
                self._registry, scope, request.render, layout, self._tokenizer, self.incarnation
            )
        shown.watchers += 1
        return PromptWatch(shown), subscription

    async def prompts(
        self,
        watch: PromptWatch,
        subscription: Subscription,
        client: Client | None,
        shows: Shows | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """The prompt now, then again after each burst of changes that affects it; its
        messages being written count against `client`'s share of the prompts in flight,
        their bytes against the prompts' pace (`prompt_pace.py`: clients in turn), and
        their sending against its share of the loop. A watcher that waits for its turn
        sends the latest prompt with every change since its last; a step's change held in
        a layer `shows` does not name, anonymous (as the caller's change watch shows it)."""
        in_flight, pace = self.prompts_in_flight, self.prompt_pace
        key, sharer = None if client is None else client.key, share_key(client)
        try:
            # the bytes in flight are given back once written; the pace's turn once built
            async with in_flight.reserved(await watch.size(), key), pace.turn(key) as paced:
                prompt = await watch.prompt((), shows)
                paced.spent(len(prompt))  # the next turn waits for these bytes' time
                yield self._charged(sharer, prompt)
                del prompt
            while True:
                burst: list[Any] = [await subscription.next()]
                await asyncio.sleep(self._settings.prompt_coalesce_s)
                await self._shares.turn(sharer)  # the changes meanwhile make one prompt
                async with in_flight.reserved(await watch.size(), key), pace.turn(key) as paced:
                    while (item := subscription.poll()) is not None:  # also while it waited
                        burst.append(item)
                    burst = [_shown(item, shows) for item in burst]
                    turn = await self.turns.take()
                    try:
                        prompt = await watch.prompt(burst, shows)  # built in the turn: at its pace
                        paced.spent(len(prompt))
                        turn.spent(len(prompt))
                        yield self._charged(sharer, prompt)
                        del prompt  # the stream keeps no prompt once it is written
                    finally:
                        turn.done()
        finally:
            self._leave(watch.shown)

    def _charged(self, sharer: str | None, prompt: bytes) -> bytes:
        """`prompt`, its sending counted against `sharer`'s share of the loop."""
        self._shares.charge(sharer, wire_s(len(prompt)))
        return prompt

    def shared_prompts(self) -> list[ScopePrompt]:
        """The prompts watchers share now, one per scope, render and layout watched."""
        return list(self._shown.values())

    def _leave(self, shown: ScopePrompt) -> None:
        """One watcher of `shown` ended; the last one drops the shared prompt."""
        shown.watchers -= 1
        if not shown.watchers:
            self._shown = {key: kept for key, kept in self._shown.items() if kept is not shown}

    # -- bounds -----------------------------------------------------------------------

    def admit(self, client: Client | None) -> None:
        """Count one more watch of `client`: QUOTA_EXCEEDED past the sidecar's or the client's
        bound."""
        watchers = self._registry.changes.subscriber_count()
        if watchers >= self._settings.max_watchers:
            raise quota_exceeded(f"the sidecar already has {watchers} watchers, its limit")
        self._per_client.admit(client)

    def release(self, client: Client | None) -> None:
        """One watch of `client` ended."""
        self._per_client.release(client)


def _burst(subscription: Subscription, first: Change) -> list[Change]:
    """`first` and the events pending after it, up to a gap or the batch bound."""
    if isinstance(first, Missed):
        return [first]
    return [first, *subscription.take(MAX_BATCH_EVENTS - 1)]


def _shown(item: Change, shows: Shows | None) -> Change:
    """`item` as a caller shown only the steps of the layers `shows` names sees it."""
    if shows is None or not isinstance(item, ChangeEvent) or item.kind not in STEPS:
        return item
    return item if shows(item.scope) else anonymous(item)


def _kept(keeps: Callable[[Kind, str | None], bool], event: ChangeEvent) -> bool:
    """Whether a filtered watch gets `event`: one of a layer the filter keeps, or of a step
    registered with `global` wherever it keeps the global layer (such a step runs in every
    chain, whichever layer holds it: a watcher of its chain, a scoped agent's local cache,
    must hear of it), or one that re-bound a key the filter keeps (its chain changed)."""
    if keeps(event.kind, event.scope) or (event.everywhere and keeps(event.kind, None)):
        return True
    return any(keeps(event.kind, key) for key in event.rebound)
