"""The calls each client has running, and what one of its calls costs lately: what its
running calls will still cost the loop, counted before it may start another (shares.py).

A client's turn was decided on what its calls had cost so far: one over its share waited,
one within it went. But a call's cost comes after its turn, step by step, and a client
within its share could start any number of calls at once: a burst of 150 assemblies, each
cheap to start and dear to finish (a provider's 240 KB answer to read, a listener to hand
it to), was let go one by one while the first steps stayed within the share, and the loop
then ran them ahead of everyone else's next steps (issue 34's listener burst beside the
hostile soak's agents: their p99 was 39.8-46.3 ms without this, 36.2-39.0 ms with it, two
runs each side by side). As Kubernetes' API priority and fairness counts the seats a flow's
requests occupy until they end, with each request's width estimated from its kind, a new
call of a client is judged on its use plus what its running calls are expected to cost:
each its client's recent cost per call (its use over the calls it ended lately).
"""

from __future__ import annotations

from .use import Use


class Running:
    """Per client, the unary calls started and not ended, and how many it ended lately
    (a rate decayed over the shares' window, as its use is)."""

    __slots__ = ("_calls", "_ended")

    def __init__(self) -> None:
        self._calls: dict[str, int] = {}
        self._ended: dict[str, Use] = {}

    def begin(self, key: str) -> None:
        """A call of `key` starts."""
        self._calls[key] = self._calls.get(key, 0) + 1

    def end(self, key: str, now: float, window_s: float) -> None:
        """A call of `key` ends."""
        left = self._calls[key] - 1
        if left:
            self._calls[key] = left
        else:
            del self._calls[key]
        ended = self._ended.get(key)
        if ended is None:
            ended = self._ended[key] = Use()
        ended.add(now, window_s, 1.0)

    def calls(self, key: str) -> int:
        """How many calls of `key` run now."""
        return self._calls.get(key, 0)

    def expected_s(self, key: str, use: float, now: float, window_s: float) -> float:
        """What the running calls of `key`, whose use of the loop is `use` lately, are
        expected to cost: each what its calls cost lately, its use over the calls it ended
        per second (one a window at least: a client that ended none is not counted free)."""
        calls = self._calls.get(key, 0)
        if not calls:
            return 0.0
        ended = self._ended.get(key)
        per_s = 0.0 if ended is None else ended.now(now, window_s)
        return calls * use / max(per_s, 1.0 / window_s)

    def forget(self, key: str) -> None:
        """`key` is idle: forget the calls it ended (none of its calls runs)."""
        if key not in self._calls:
            self._ended.pop(key, None)
