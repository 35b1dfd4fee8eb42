"""Per-client counts (sessions, watches), so one client cannot take all the sidecar has."""

from __future__ import annotations

from collections import Counter

from ...registry.limits import quota_exceeded
from ..guard.clients import Client


class ClientCounts:
    """How many of `what` each client holds, against `limit` (config key `key`); a client
    the sidecar cannot tell apart (None: a unix socket without credentials) is not counted."""

    def __init__(
        self, limit: int, what: str = "sessions", key: str = "limits.max_sessions_per_peer"
    ) -> None:
        self.limit = limit
        self._what = what
        self._key = key
        self._counts: Counter[str] = Counter()

    def admit(self, client: Client | None) -> None:
        """Count one more for `client`; QUOTA_EXCEEDED when it holds `limit` already."""
        if client is None:
            return
        held = self._counts[client.key]
        if held >= self.limit:
            raise quota_exceeded(
                f"{client.name} already has {held} {self._what}, the limit per client"
                f" ({self._key}): close some"
            )
        self._counts[client.key] = held + 1

    def release(self, client: Client | None) -> None:
        """One of `client`'s ended."""
        if client is None:
            return
        if self._counts[client.key] > 1:
            self._counts[client.key] -= 1
        else:
            self._counts.pop(client.key, None)
