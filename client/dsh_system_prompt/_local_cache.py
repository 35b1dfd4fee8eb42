"""The opt-in local cache (`connect(local_cache=True)`): `assemble()` of a scope whose plan
the sidecar marks `cacheable` (all-static) or `cacheable_with_fields` (its only non-static
steps are rules) answers from a copy kept here, without a call.

A static plan's answer is kept under its scope alone (it ignores the fields, as the
sidecar's own kept answers do); a rules-only plan's under its scope and the request's very
`fields_json` (a rule reads only the assembly, the fields and the scope). Each is kept with
what it read: the layers of its scope chain
(`AssembleResponse.scope_chain`, the asked key and the global layer) and their revision
(`cache_revision`). It is served until a change event of one of those layers comes with
a later revision, or one that re-bound a scope key of its chain (the event's
`rebound_scopes`: a key that got a parent, or lost it when nothing held it any more), or
one the sidecar marks `global` (the global layer's, or a listener or rule that runs
everywhere), so a change in another scope, a step registered on another scope among
them, leaves it in place. From a sidecar that does not say `global`, any listener or rule
event counts (one registered with `global` runs everywhere, and it cannot tell). A sidecar
that sends no `cache_revision` is one where every change counts.

Changes come from a change stream: one of every change when the credential may watch
every layer, else (PERMISSION_DENIED: an agent that lists its own scopes) one per scope
assembled, filtered to that scope's chain (its layer, its ancestors', the global one),
at most `MAX_SCOPE_WATCHES` of them. The replies to this client's own registrations,
updates and disposals count too (read-your-writes). While a stream is broken, and
after a resync or a gap, nothing it covers is served or kept: a break may hide
changes, and a restarted sidecar's revisions start again.

What is kept is bounded by `max_bytes` (its texts counted: names, texts, tool schemas,
variables) and by `MAX_ENTRIES`, the least recently used dropped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections import OrderedDict, deque
from dataclasses import dataclass

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from ._changes import WATCH_FEATURES, ChangeStream
from .errors import SystemPromptError
from .types import (
    AssembledContext,
    AssembledSection,
    ChangeEvent,
    ChangesMissed,
    ChangesResynced,
    PromptAssembly,
    ToolSchema,
)

_log = logging.getLogger("dsh_system_prompt")
MAX_BYTES = 32 * 1024 * 1024  # connect(local_cache_bytes=...)'s default
MAX_ENTRIES = 256  # answers kept (a scope's, or a scope's for some fields)
MAX_SCOPE_WATCHES = 16  # change streams of one scope each, for a credential listing scopes
_RECENT = 1024  # change events remembered for answers in flight while they came
_REFUSED = 1024  # scopes whose watch was refused, not asked again (then forgotten)
_EVERY_LAYER = None  # an event every kept answer reads: the global layer's, a step's
Layers = frozenset[str] | None  # the scope keys a change concerns; None: every one
# an older sidecar's events do not say `global`: a step of these kinds may run everywhere
_STEP_KINDS = frozenset({"listener", "rule"})
# What an answer is kept under: its scope, and the request's fields_json for a rules-only
# plan's (None: a static plan's, the same for any fields).
Key = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class _Template:
    """A converted assembly, as plain values: each answer is built afresh from it."""

    revision: int  # of what it read (cache_revision; an older sidecar's: the registry's)
    reads: frozenset[str] | None  # the scope keys it read; None: every change concerns it
    watch: _Watch  # the change stream that tells when it goes
    size: int  # its texts' bytes, against the cache's budget
    sections: tuple[tuple[str, str], ...]
    contexts: tuple[tuple[str, str], ...]
    tools: tuple[tuple[str, str, str], ...]  # name, description, parameters JSON
    variables: tuple[tuple[str, str | None], ...]

    def copy(self) -> PromptAssembly:
        """A new assembly the caller may change freely (tools parse their JSON when read)."""
        return PromptAssembly(
            sections=[AssembledSection(name, text) for name, text in self.sections],
            contexts=[AssembledContext(name, text) for name, text in self.contexts],
            tools=[ToolSchema.from_json(n, d, p) for n, d, p in self.tools],
            variables=dict(self.variables),
        )

    def concerned(self, layers: Layers, revision: int) -> bool:
        """Whether a change of `layers` (None: every layer) at `revision` makes it stale."""
        if revision <= self.revision:
            return False  # it is in the answer already
        return layers is _EVERY_LAYER or self.reads is None or not self.reads.isdisjoint(layers)


def template_of(reply: pb.AssembleResponse, key: Key, watch: _Watch) -> _Template:
    scope, fields = key
    message = reply.assembly
    sections = tuple((s.name, s.text) for s in message.sections)
    contexts = tuple((c.name, c.text) for c in message.contexts)
    tools = tuple((t.name, t.description, t.parameters_json) for t in message.tools)
    variables = tuple((v.name, v.value if v.HasField("value") else None) for v in message.variables)
    strings = [s for part in (*sections, *contexts, *tools) for s in part]
    strings += [s for pair in variables for s in pair if s is not None]
    if reply.cache_revision:
        revision, reads = reply.cache_revision, frozenset((scope, *reply.scope_chain))
    else:
        revision, reads = reply.revision, None
    return _Template(
        revision=revision,
        reads=reads,
        watch=watch,
        size=sum(map(sys.getsizeof, strings)) + sys.getsizeof(scope) + sys.getsizeof(fields),
        sections=sections,
        contexts=contexts,
        tools=tools,
        variables=variables,
    )


@dataclass(frozen=True, slots=True)
class Ticket:
    """Taken before an Assemble call: what its answer is kept against."""

    epoch: int  # the cache's: moves when every answer is dropped
    watch: _Watch
    watch_epoch: int  # the stream's: moves when it broke, resynced or missed events
    sequence: int  # the change events seen so far


class _Watch:
    """One change stream the cache follows: of every layer (`scope` None), or of one
    scope's chain."""

    def __init__(self, cache: LocalCache, scope: str | None) -> None:
        self._cache = cache
        self.scope = scope
        request = pb.WatchChangesRequest(features=WATCH_FEATURES)
        if scope is not None:
            request.filter.CopyFrom(pb.ChangeFilter(scope=scope, ancestors=True))
        self._changes = ChangeStream(cache.stub, request, cache.timeout, self.broke, self.resumed)
        self.live = False
        self.epoch = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._changes.start()
        self.live = True
        self._task = asyncio.create_task(self._follow())

    def broke(self) -> None:
        """The stream broke: changes may pass unseen until it resumes."""
        self.live = False
        self.lost()

    def resumed(self) -> None:
        """Subscribed again (its replay, or a resync, follows)."""
        self.lost()
        self.live = True

    def lost(self) -> None:
        self.epoch += 1
        self._cache.lost(self)

    async def close(self) -> None:
        self.live = False
        await self._changes.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        try:
            async for item in self._changes:
                if isinstance(item, ChangeEvent):
                    self._cache.changed(item)
                elif isinstance(item, ChangesResynced | ChangesMissed):
                    self.lost()  # another incarnation's revisions, or a gap
        except SystemPromptError as error:
            where = "" if self.scope is None else f" for scope {self.scope!r}"
            _log.warning("local cache off%s: its change stream ended: %r", where, error.message)
            if error.code == grpc.StatusCode.PERMISSION_DENIED and self.scope is not None:
                self._cache.refused(self.scope)
        finally:
            self.live = False
            self.lost()
            self._cache.ended(self)


class LocalCache:
    """Cacheable answers by scope (and fields, for a rules-only plan), each valid until a
    layer it read changes."""

    def __init__(
        self, stub: pb_grpc.SystemPromptServiceStub, timeout: float, max_bytes: int = MAX_BYTES
    ) -> None:
        self.stub = stub
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.bytes = 0  # what the kept answers' texts take
        self._entries: OrderedDict[Key, _Template] = OrderedDict()
        self._every: _Watch | None = None  # the stream of every change, when allowed
        self._scoped: dict[str, _Watch] = {}  # else one per scope
        self._refused: set[str] = set()
        self._opening: set[asyncio.Task[None]] = set()
        self._recent: deque[tuple[int, int, Layers]] = deque(maxlen=_RECENT)
        self._sequence = 0  # change events seen (and own writes)
        self.epoch = 0  # moves whenever every answer is dropped
        self.live = False
        self.answered = 0  # assemblies answered here, without a call
        self.asked = 0  # and those asked of the sidecar

    async def start(self) -> None:
        """Subscribe to every change, or, when the credential may not, get ready to watch
        each scope assembled; answers are kept from here on."""
        watch = _Watch(self, None)
        try:
            await watch.start()
        except SystemPromptError as error:
            if error.code != grpc.StatusCode.PERMISSION_DENIED:
                raise
        else:
            self._every = watch
        self.live = True

    def ticket(self, scope: str) -> Ticket | None:
        """What an answer for `scope` asked for now is kept against; None: it is not kept
        (no stream covers the scope yet: one is opened for the next)."""
        self.asked += 1
        watch = self._watch_of(scope) if self.live else None
        if watch is None or not watch.live:
            return None
        return Ticket(self.epoch, watch, watch.epoch, self._sequence)

    def get(self, scope: str, fields_json: str) -> PromptAssembly | None:
        """A copy of the kept answer for `scope` (a static plan's) or for `scope` with these
        very `fields_json` (a rules-only plan's), if it is still the registry's."""
        if not self.live:
            return None
        for key in ((scope, None), (scope, fields_json)):
            entry = self._entries.get(key)
            if entry is not None and entry.watch.live:
                self._entries.move_to_end(key)
                self.answered += 1
                return entry.copy()
        return None

    def put(
        self, ticket: Ticket | None, scope: str, fields_json: str, reply: pb.AssembleResponse
    ) -> None:
        """Keep `reply`, asked for with `ticket`, unless something was lost since: under
        `scope` when it is `cacheable`, under `scope` and `fields_json` when it is
        `cacheable_with_fields`; else not at all."""
        if reply.cacheable:
            key: Key = (scope, None)
        elif reply.cacheable_with_fields:
            key = (scope, fields_json)
        else:
            return
        if ticket is None or ticket.epoch != self.epoch:
            return
        watch = ticket.watch
        if not watch.live or ticket.watch_epoch != watch.epoch:
            return
        entry = template_of(reply, key, watch)
        if self._overtaken(entry, ticket.sequence) or entry.size > self.max_bytes:
            return
        self._drop(key)
        self._entries[key] = entry
        self.bytes += entry.size
        while self.bytes > self.max_bytes or len(self._entries) > MAX_ENTRIES:
            self._drop(next(iter(self._entries)))  # the least recently used

    def changed(self, event: ChangeEvent) -> None:
        """A change event: the answers that read its layer, or a key it re-bound, go."""
        said = event.global_
        everywhere = event.scope is None or (event.kind in _STEP_KINDS if said is None else said)
        layers = frozenset((event.scope, *event.rebound_scopes)) if event.scope else None
        self._seen(None if everywhere else layers, event.revision)

    def wrote(self, revision: int) -> None:
        """This client changed the registry; the reply said `revision` (0: not said)."""
        if revision:
            self._seen(_EVERY_LAYER, revision)  # its layer unknown here: any
        else:
            self.drop()

    def drop(self) -> None:
        """Forget every answer, and any answer asked for before now."""
        self._entries.clear()
        self.bytes = 0
        self.epoch += 1

    def lost(self, watch: _Watch) -> None:
        """`watch` may have missed changes: what it covers goes."""
        for key in [k for k, entry in self._entries.items() if entry.watch is watch]:
            self._drop(key)

    def refused(self, scope: str) -> None:
        if len(self._refused) >= _REFUSED:
            self._refused.clear()
        self._refused.add(scope)

    def ended(self, watch: _Watch) -> None:
        """`watch` ended for good: a scope's may be opened again later."""
        if watch.scope is not None and self._scoped.get(watch.scope) is watch:
            del self._scoped[watch.scope]

    async def close(self) -> None:
        self.live = False
        for task in list(self._opening):
            task.cancel()
        watches = [*self._scoped.values(), *([self._every] if self._every else [])]
        self._scoped.clear()
        for watch in watches:
            await watch.close()

    def _watch_of(self, scope: str) -> _Watch | None:
        """The stream covering `scope`: the one of every change, else the scope's own,
        opened in the background the first time (none for the global layer alone, or
        past MAX_SCOPE_WATCHES, or where the watch was refused)."""
        if self._every is not None:
            return self._every
        watch = self._scoped.get(scope)
        if watch is not None or not scope or scope in self._refused:
            return watch
        if len(self._scoped) >= MAX_SCOPE_WATCHES:
            return None
        watch = self._scoped[scope] = _Watch(self, scope)
        task = asyncio.get_running_loop().create_task(self._open(watch))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)
        return watch

    async def _open(self, watch: _Watch) -> None:
        try:
            await watch.start()
        except SystemPromptError as error:
            assert watch.scope is not None
            if error.code == grpc.StatusCode.PERMISSION_DENIED:
                self.refused(watch.scope)
            self.ended(watch)

    def _seen(self, layers: Layers, revision: int) -> None:
        self._sequence += 1
        self._recent.append((self._sequence, revision, layers))
        stale = [k for k, entry in self._entries.items() if entry.concerned(layers, revision)]
        for key in stale:
            self._drop(key)

    def _overtaken(self, entry: _Template, sequence: int) -> bool:
        """Whether a change seen since `sequence` (while the answer was on its way) makes
        `entry` stale, or too many came to tell."""
        if self._sequence == sequence:
            return False
        if not self._recent or self._recent[0][0] > sequence + 1:
            return True  # some have been forgotten
        return any(
            entry.concerned(layers, revision)
            for seen, revision, layers in self._recent
            if seen > sequence
        )

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry.size
