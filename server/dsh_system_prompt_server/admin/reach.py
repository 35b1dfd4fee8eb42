"""What a signed-in credential reaches on the admin page: the same policy as its gRPC calls.

Every view and every query parameter is decided as the RPC that reads the same thing:
the Prompt view of a scope as WatchPrompt of it, the Cache view of a scope or a report
key as GetCacheHistory of it (with values: it shows a diff of prompt text), the Sessions
view (every session, every scope) as a listing of every layer. The Scopes view and the
pickers are not refused but filtered: a credential sees the global layer and the scopes
its patterns match, and only the report keys it may read, so a name it may not read is
never shown, not even in a list to pick from.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from ..guard import Credential, Request, Role, Verb, decide, step_names
from ..reports import HistoryKey


@dataclass(frozen=True)
class Reach:
    """One credential's reach on the page."""

    credential: Credential

    @property
    def key(self) -> Hashable:
        """What a filtered view's shared render is keyed by: two credentials with the same
        role and patterns see the same."""
        if self.credential.role is Role.ADMIN:
            return Role.ADMIN
        return (self.credential.role, self.credential.grants.scopes)

    @property
    def names(self) -> Callable[[str | None], bool] | None:
        """Which layers' waterfall steps the credential is shown by name (None: every
        layer's), as in its watches and listings: the scopes it lists."""
        return step_names(self.credential)

    def denial(self, view: str, scope: str | None, key: str | None) -> str | None:
        """Why the credential may not open `view` of `scope` (or report `key`), or None."""
        if view == "prompt":
            request = Request(verb=Verb.WATCH_PROMPT, scope=scope, values=True)
        elif view == "cache":
            request = Request(
                verb=Verb.READ_HISTORY, scope=scope, report_key=key or "", values=True
            )
        elif view == "sessions":  # every session, with what it registered where
            request = Request(verb=Verb.LIST, every_scope=True)
        else:  # the Scopes view: filtered, never refused
            return None
        verdict = decide(self.credential, request)
        return None if verdict is None else verdict.message

    def scope(self, key: str | None) -> bool:
        """Whether the credential may read scope `key` (None: the global layer)."""
        return decide(self.credential, Request(verb=Verb.LIST, scope=key)) is None

    def history(self, key: HistoryKey) -> bool:
        """Whether the credential may read the cache history `key`."""
        if key.kind == "key":
            request = Request(verb=Verb.READ_HISTORY, report_key=key.name or "")
        else:
            request = Request(verb=Verb.READ_HISTORY, scope=key.name)
        return decide(self.credential, request) is None
