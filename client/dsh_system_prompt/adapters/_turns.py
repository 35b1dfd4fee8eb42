"""What the framework adapters share: one client's assemblies for a scope, fields and report key."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping
from typing import Any

from ..client import Client
from ..types import RenderedPrompt


class Turns:
    """Renders the registry's prompt for a scope and fields, one assembly per key (a turn)."""

    def __init__(
        self,
        client: Client,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        *,
        report_key: str | None = None,
    ) -> None:
        self._client = client
        self.scope = scope
        self.fields = dict(fields or {})
        self.report_key = report_key
        # The latest turn's key and its assembly, being made or made.
        self._turn: tuple[Hashable, asyncio.Task[RenderedPrompt]] | None = None

    @property
    def report(self) -> dict[str, str | None]:
        """`client.report_usage(usage, **prompt.report)`: where this prompt's usage goes."""
        return {"scope": self.scope, "report_key": self.report_key}

    async def render(self) -> RenderedPrompt:
        """A new assembly, rendered (reported when a report key is set)."""
        return await self._client.render(
            self.scope,
            self.fields,
            report=self.report_key is not None,
            report_key=self.report_key,
        )

    def _assembled(self, key: Hashable, *, fresh: bool = False) -> asyncio.Future[RenderedPrompt]:
        """The turn `key`'s assembly: started by its first caller (and by a `fresh` one once
        the last is made), shielded so that one caller's cancellation leaves it to the others."""
        latest = self._turn
        if latest is None or latest[0] != key or (fresh and latest[1].done()):
            latest = self._turn = (key, asyncio.ensure_future(self.render()))
        return asyncio.shield(latest[1])
