"""WatchPrompt's messages: each live prompt of a scope, with the changes that led to it.

The prompt and its cache verdict are `reports/live_prompt.py`'s; this adds the stream's
part: the changes since the last message, the incarnation, the rendering when asked.
"""

from __future__ import annotations

from collections.abc import Sequence

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import RenderFailure, render_context_snapshot, render_prompt

from ...registry import ChangeEvent, Missed, Registry, RegistryError
from ...reports.history import HistoryKey
from ...reports.live_prompt import LivePrompt
from ...reports.tokens import Tokenizer
from ...reports.values import Layout
from ..convert import change_to_proto
from ..encoding import assembly_to_proto
from ..report_messages import report_to_proto

MAX_CHANGES_LISTED = 64  # per message; the rest of a burst is counted, not listed


class PromptWatch:
    """One WatchPrompt stream's prompts, each compared with the one before."""

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
        self._render = render
        self._layout = layout
        self._incarnation = incarnation
        self._key = HistoryKey("scope", scope)

    async def prompt(self, changes: Sequence[ChangeEvent | Missed] = ()) -> pb.WatchPromptResponse:
        """The scope's prompt now, with `changes` (what led to it since the last one)."""
        events = [change for change in changes if isinstance(change, ChangeEvent)]
        missed = sum(change.count for change in changes if isinstance(change, Missed))
        listed = events[-MAX_CHANGES_LISTED:]
        response = pb.WatchPromptResponse(
            revision=self._registry.revision,  # the prompt's: no change comes in between
            incarnation=self._incarnation,
            changes=[change_to_proto(event).event for event in listed],
            changes_omitted=missed + len(events) - len(listed),
        )
        try:
            prompt = await self._live.next(self._layout)
        except RegistryError as error:
            response.error = error.message
            return response
        assembly = prompt.assembly
        response.assembly.CopyFrom(assembly_to_proto(assembly))
        response.report.CopyFrom(report_to_proto(prompt.report, self._key))
        if self._render:
            try:
                text, snapshot = render_prompt(assembly), render_context_snapshot(assembly)
            except RenderFailure:
                pass  # report.render_error says why
            else:
                response.rendered.CopyFrom(
                    pb.RenderedPrompt(prompt=text, context_snapshot=snapshot)
                )
        return response
