"""Who pays for the messages a call sends on other clients' streams: the client whose call
it is, as it pays for the call's own steps (`shares.sharing`).

An assembly's work does not all run in its call's steps. Each listener it passes is handed
the whole assembly on that listener's stream, and the stream's outbox starts each write
(gRPC's copy into its buffers and the socket's sendmsg, on the loop's thread) when the one
before it ends, in no call's step: charged to nobody. And a client over its share waited
before its calls only: the assemblies it already had in flight went on as fast as the loop
ran them, so a burst of 150 whose provider answered 240 KB each put ~36 MB of invocations
through the loop ahead of the other clients' next steps (issue 34, the listener burst:
their p99 went from 1.6 to 3-4.6 times a calm run's).

As gRPC's flow control has a sender wait for its window before each message, not only
before its call, and as Envoy's overload manager and per-connection buffer limits act on
what a connection has in flight rather than on its new requests only, a message a call
queues on a callback stream (an invocation, a next result, a provide request) waits for
its client's turn before it is built (`Outbox.put`), and a write the outbox starts later
on costs that client its time. Large unary responses (over HTTP/2's initial window) wait
for the same turn before gRPC sends them. The answers a callback stream reads for a call
(a provider's, a listener's) cost that call's client their bytes too (`wire_s`, charged
by the exchange the call opened: rpc/streams/broker.py `Replies`), as its request does.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

# The bytes past which a unary response waits for its client's turn before it is sent:
# HTTP/2's initial flow-control window (RFC 9113, 6.9.2), past which a gRPC sender would
# wait for its peer's WINDOW_UPDATE too.
LARGE_RESPONSE_BYTES = 65_535


class Counter(Protocol):
    """What counts each client's use of the loop (`shares.Shares`, which imports this)."""

    def charge(self, key: str | None, seconds: float) -> None: ...

    async def turn(self, key: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Payer:
    """The client a call is charged to, and the shares that count it."""

    shares: Counter
    key: str

    def charge(self, seconds: float) -> None:
        self.shares.charge(self.key, seconds)

    async def turn(self) -> None:
        await self.shares.turn(self.key)


# The payer of the call being served, set by the shares' interception for a call whose
# client is told apart; each gRPC call runs in a context of its own (as clients.CALLER).
PAYER: ContextVar[Payer | None] = ContextVar("payer", default=None)


def payer() -> Payer | None:
    """Who pays for what the call being served sends now (None: nobody is held)."""
    return PAYER.get()


async def paying_turn() -> None:
    """Return once the call being served may send its next message: at once unless its
    client is over its share of a busy loop (`Shares.turn`)."""
    paying = PAYER.get()
    if paying is not None:
        await paying.turn()
