"""The opt-in local cache (`connect(local_cache=True)`): `assemble()` of a scope whose plan
the sidecar marks `cacheable` answers from a copy kept here, without a call.

An answer is kept under (scope, fields) with the registry revision it was taken at,
and served while no later revision is known. Later revisions come from this client's
own change stream (every change, of every scope) and from the replies to this
client's own registrations, updates and disposals (read-your-writes). While the
change stream is broken, and after a resync, nothing is served or kept: a break may
hide changes, and a restarted sidecar's revisions start again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from ._changes import WATCH_FEATURES, ChangeStream
from .errors import SystemPromptError
from .types import AssembledContext, AssembledSection, ChangesResynced, PromptAssembly, ToolSchema

_log = logging.getLogger("dsh_system_prompt")
_MAX_ENTRIES = 256  # (scope, fields) pairs; a revision change makes them all unservable

Key = tuple[str, str]  # (scope, fields_json) as sent


@dataclass(frozen=True, slots=True)
class _Template:
    """A converted assembly, as plain values: each answer is built afresh from it."""

    revision: int
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


def template_of(reply: pb.AssembleResponse) -> _Template:
    message = reply.assembly
    return _Template(
        revision=reply.revision,
        sections=tuple((s.name, s.text) for s in message.sections),
        contexts=tuple((c.name, c.text) for c in message.contexts),
        tools=tuple((t.name, t.description, t.parameters_json) for t in message.tools),
        variables=tuple(
            (v.name, v.value if v.HasField("value") else None) for v in message.variables
        ),
    )


class LocalCache:
    """Cacheable answers by (scope, fields), valid while their revision is the latest known."""

    def __init__(self, stub: pb_grpc.SystemPromptServiceStub, timeout: float) -> None:
        request = pb.WatchChangesRequest(features=WATCH_FEATURES)  # every change, every scope
        self._changes = ChangeStream(stub, request, timeout, self.broke, self.resumed)
        self._entries: dict[Key, _Template] = {}
        self.known = 0  # the latest revision this client knows of
        self.epoch = 0  # moves whenever what is known may have been lost
        self.live = False  # the change stream is subscribed
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Subscribe to the changes; answers are kept from here on."""
        await self._changes.start()
        self.known = self._changes.revision
        self.live = True
        self._task = asyncio.create_task(self._follow())

    def get(self, key: Key) -> PromptAssembly | None:
        """A copy of the kept answer for `key`, if it is still the registry's."""
        entry = self._entries.get(key) if self.live else None
        if entry is None or entry.revision < self.known:
            return None
        return entry.copy()

    def put(self, epoch: int, key: Key, reply: pb.AssembleResponse) -> None:
        """Keep `reply`, asked for at `epoch`, unless something was lost since."""
        if not reply.cacheable or epoch != self.epoch or not self.live:
            return
        if reply.revision < self.known:
            return  # a later change is known already
        if len(self._entries) >= _MAX_ENTRIES and key not in self._entries:
            self._entries.clear()  # they share one revision: most are about to go anyway
        self._entries[key] = template_of(reply)

    def wrote(self, revision: int) -> None:
        """This client changed the registry; the reply said `revision` (0: not said)."""
        if revision:
            self.known = max(self.known, revision)
        else:
            self.drop()

    def drop(self) -> None:
        """Forget every answer, and any answer asked for before now."""
        self._entries.clear()
        self.epoch += 1

    def broke(self) -> None:
        """The change stream broke: changes may pass unseen until it resumes."""
        self.live = False
        self.drop()

    def resumed(self) -> None:
        """The change stream is subscribed again (its replay, or a resync, follows)."""
        self.drop()
        self.known = self._changes.last_revision
        self.live = True

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
                if isinstance(item, ChangesResynced):
                    self.drop()  # another incarnation's revisions, or a gap
                self.known = max(self.known, self._changes.last_revision)
        except SystemPromptError as error:
            _log.warning("local cache off: its change stream ended: %r", error.message)
        finally:
            self.live = False
            self.drop()
