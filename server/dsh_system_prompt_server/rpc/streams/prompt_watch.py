"""WatchPrompt's messages: each live prompt of a scope, with the changes that led to it.

The prompt and its cache verdict are `reports/live_prompt.py`'s; this adds the stream's
part: the changes since the last message, the incarnation, the rendering when asked.
Watchers of one scope share one prompt per revision (built, reported and encoded once),
so a watcher costs its stream, not a copy of the prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import RenderFailure, render_context_snapshot, render_prompt

from ...registry import ChangeEvent, Missed, Origin, Registry, RegistryError
from ...reports import (
    HistoryKey,
    Layout,
    LivePrompt,
    Shows,
    StaticPrompt,
    Tokenizer,
    build_report,
    hidden,
)
from ...wire import assembly_to_proto, change_to_proto, report_to_proto

MAX_CHANGES_LISTED = 64  # per message; the rest of a burst is counted, not listed


class ScopePrompt:
    """The prompt of one scope, as a render and layout choice shows it, shared by every
    watcher that asked for the same: built and encoded once per revision, however many
    watch it. Its report compares with the prompt built before (none for a stream's
    first message)."""

    def __init__(
        self,
        registry: Registry,
        scope: str | None,
        render: bool,
        layout: Layout,
        tokenizer: Tokenizer | None,
        incarnation: str,
    ) -> None:
        self._registry = registry
        self._live = LivePrompt(registry, scope, tokenizer)
        self._tokenizer = tokenizer
        self._render = render
        self._layout = layout
        self._incarnation = incarnation
        self._key = HistoryKey("scope", scope)
        self._lock = asyncio.Lock()  # one build at a time; the others wait and share it
        self._revision = -1  # of the prompt built last
        self._prompt: StaticPrompt | None = None  # None: the static parts do not assemble
        self._error = ""  # why they do not
        # first message or not, and the steps its caller is not shown by name -> encoding
        self._encoded: dict[tuple[bool, frozenset[Origin]], bytes] = {}
        self._sizes: dict[bool, int] = {}  # the same, the last encoding's size at any revision
        self.watchers = 0  # streams that show it; the last to leave drops it

    async def encoded(self, first: bool, shows: Shows = None) -> bytes:
        """The response's shared part at the registry's revision: the revision, the
        assembly, its rendering and report (with no previous when `first`), or the error;
        its steps named as `shows` names them (shared by the callers shown the same)."""
        async with self._lock:
            if self._revision != self._registry.revision:
                await self._build()
            key = (first, self._hidden(shows))
            encoded = self._encoded.get(key)
            if encoded is None:
                encoded = self._encoded[key] = self._encode(first, shows)
                self._sizes[first] = len(encoded)
            return encoded

    def _hidden(self, shows: Shows) -> frozenset[Origin]:
        """The rules (the live prompt runs no listener) its report names that `shows` does
        not name: what tells one caller's encoding from another's."""
        prompt = self._prompt
        if prompt is None or shows is None:
            return frozenset()
        steps = (named.origin for named in prompt.report.stability.seen.steps)
        made = [*(prompt.assembly.origins or {}).values(), *steps]
        return frozenset(origin for origin in made if hidden(origin, shows))

    async def size(self, first: bool) -> int:
        """About what `encoded(first)` takes: the last encoding's size (a revision's prompt is
        about the one before it), so that a watcher waiting for its turn builds nothing."""
        size = self._sizes.get(first)
        return len(await self.encoded(first)) if size is None else size

    async def _build(self) -> None:
        self._revision, self._encoded = self._registry.revision, {}
        try:
            self._prompt, self._error = await self._live.next(self._layout), ""
        except RegistryError as error:
            self._prompt, self._error = None, error.message

    def _encode(self, first: bool, shows: Shows) -> bytes:
        response = pb.WatchPromptResponse(revision=self._revision, incarnation=self._incarnation)
        prompt = self._prompt
        if prompt is None:
            response.error = self._error
            return response.SerializeToString()
        report = prompt.report
        if first and prompt.before is not None:  # a stream's first message compares with none
            report, _ = build_report(prompt.assembly, self._tokenizer, self._layout, None)
        assembly = prompt.assembly
        response.assembly.CopyFrom(assembly_to_proto(assembly))
        response.report.CopyFrom(report_to_proto(report, self._key, shows))
        if self._render:
            try:
                text, snapshot = render_prompt(assembly), render_context_snapshot(assembly)
            except RenderFailure:
                pass  # report.render_error says why
            else:
                response.rendered.CopyFrom(
                    pb.RenderedPrompt(prompt=text, context_snapshot=snapshot)
                )
        return response.SerializeToString()


class PromptWatch:
    """One WatchPrompt stream: the shared prompt of its scope, with its own changes."""

    def __init__(self, shown: ScopePrompt) -> None:
        self.shown = shown
        self._first = True

    async def size(self) -> int:
        """About what the next message takes: its shared part (its changes are bounded)."""
        return await self.shown.size(self._first)

    async def prompt(
        self, changes: Sequence[ChangeEvent | Missed] = (), shows: Shows = None
    ) -> bytes:
        """The scope's prompt now with `changes` (what led to it since the stream's last
        message), encoded: the shared part joined with this stream's changes; its report's
        steps named as `shows` names them."""
        shared = await self.shown.encoded(self._first, shows)
        self._first = False
        events = [change for change in changes if isinstance(change, ChangeEvent)]
        missed = sum(change.count for change in changes if isinstance(change, Missed))
        listed = events[-MAX_CHANGES_LISTED:]
        own = pb.WatchPromptResponse(
            changes=[change_to_proto(event).event for event in listed],
            changes_omitted=missed + len(events) - len(listed),
        )
        return shared + own.SerializeToString()  # disjoint fields: the encodings join
