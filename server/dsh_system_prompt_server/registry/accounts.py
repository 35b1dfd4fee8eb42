"""Quotas per client: what one client may hold, so that it cannot take all the sidecar has
and lock every other client out.

`ClientCounts` counts anything per client against a limit: the rpc layer's sessions and
watches, and here what each client's sessions registered (`Accounts`): the bytes of their
values (`limits.max_bytes_per_peer`, inside `max_total_bytes`) and their listeners
(`limits.max_listeners_per_peer`, inside `max_listeners`).

Who a client is, the registry does not know: the layer above says which client an owner
(a session) belongs to, an opaque `Client`, before the owner registers anything. An owner
it was told no client of is counted against nobody: only the sidecar-wide limits apply.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .limits import Limits, quota_exceeded


@dataclass(frozen=True)
class Client:
    """One client as the quotas count it: `key` tells it apart, `name` is how a refusal
    names it."""

    key: str
    name: str


class ClientCounts:
    """How many of `what` each client holds, against `limit` (config key `key`); a client
    the sidecar cannot tell apart (None: a unix socket without credentials) is not counted."""

    def __init__(
        self,
        limit: int,
        what: str = "sessions",
        key: str = "limits.max_sessions_per_peer",
        remedy: str = "close some",
    ) -> None:
        self.limit = limit
        self._what = what
        self._key = key
        self._remedy = remedy
        self._counts: Counter[str] = Counter()  # by client key; none kept at 0

    def check(self, client: Client | None, adding: int = 1) -> None:
        """`client` may take `adding` more; QUOTA_EXCEEDED when that is over `limit`."""
        if client is None or adding <= 0:
            return
        held = self._counts[client.key]
        if held + adding > self.limit:
            raise quota_exceeded(self.refusal(client.name, held, adding))

    def refusal(self, name: str, held: int, adding: int) -> str:
        return (
            f"{name} already has {held} {self._what}, the limit per client ({self._key}):"
            f" {self._remedy}"
        )

    def add(self, client: Client | None, amount: int) -> None:
        """Count `amount` more for `client` (negative: given back)."""
        if client is None:
            return
        self._counts[client.key] += amount
        if self._counts[client.key] <= 0:  # nothing held: forget it (clients are many)
            del self._counts[client.key]

    def admit(self, client: Client | None) -> None:
        """Count one more for `client`; QUOTA_EXCEEDED when it holds `limit` already."""
        self.check(client)
        self.add(client, 1)

    def release(self, client: Client | None) -> None:
        """One of `client`'s ended."""
        self.add(client, -1)


class _ClientBytes(ClientCounts):
    def refusal(self, name: str, held: int, adding: int) -> str:
        return (
            f"{name} already has {held} bytes of registered values, {adding} more would be"
            f" over the limit per client of {self.limit} (limits.max_bytes_per_peer):"
            " dispose some"
        )


class Accounts:
    """The client of each owner, and the bytes and listeners each client's owners hold."""

    def __init__(self) -> None:
        self._client_of: dict[str, Client] = {}  # by owner
        self._bytes = _ClientBytes(0)  # each check takes the live limit
        self._listeners = ClientCounts(
            0, "listeners", "limits.max_listeners_per_peer", "dispose some"
        )

    def bind(self, owner: str, client: Client | None) -> None:
        """`owner`, which has registered nothing yet, belongs to `client` (None: nobody)."""
        if client is not None:
            self._client_of[owner] = client

    def unbind(self, owner: str) -> None:
        """`owner` is gone, with everything it registered."""
        self._client_of.pop(owner, None)

    def check_bytes(self, owner: str, adding: int, limits: Limits) -> None:
        """`owner` may register `adding` bytes more; QUOTA_EXCEEDED naming its client
        when that would take its client over `limits.max_bytes_per_peer`."""
        self._bytes.limit = limits.max_bytes_per_peer  # as a reload leaves it
        self._bytes.check(self._client_of.get(owner), adding)

    def check_listener(self, owner: str, limits: Limits) -> None:
        """`owner` may install one listener more; QUOTA_EXCEEDED naming its client when
        its client holds `limits.max_listeners_per_peer` already."""
        self._listeners.limit = limits.max_listeners_per_peer
        self._listeners.check(self._client_of.get(owner))

    def count(self, owner: str, size: int, listeners: int) -> None:
        """Add `size` bytes and `listeners` to what `owner`'s client holds (negative:
        give them back)."""
        client = self._client_of.get(owner)
        self._bytes.add(client, size)
        self._listeners.add(client, listeners)
