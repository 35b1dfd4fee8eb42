"""Per-peer counts (sessions, watches), so one connection cannot take all the sidecar has."""

from __future__ import annotations

from collections import Counter

from ...registry.limits import quota_exceeded

# gRPC names a TCP peer by address and port (one per connection); every peer of a unix
# socket is just "unix:", so the socket file's permissions are the boundary there.
_DISTINCT_PEERS = ("ipv4:", "ipv6:")


class PeerCounts:
    """How many of `what` each TCP connection holds, against `limit` (config key `key`)."""

    def __init__(
        self, limit: int, what: str = "sessions", key: str = "limits.max_sessions_per_peer"
    ) -> None:
        self.limit = limit
        self._what = what
        self._key = key
        self._counts: Counter[str] = Counter()

    def admit(self, peer: str) -> None:
        """Count one more for `peer`; QUOTA_EXCEEDED when it holds `limit` already."""
        if not peer.startswith(_DISTINCT_PEERS):
            return
        if self._counts[peer] >= self.limit:
            raise quota_exceeded(
                f"this connection already has {self._counts[peer]} {self._what}, the limit per"
                f" peer ({self._key}): open another connection or close some"
            )
        self._counts[peer] += 1

    def release(self, peer: str) -> None:
        if self._counts[peer] > 1:
            self._counts[peer] -= 1
        else:
            self._counts.pop(peer, None)
