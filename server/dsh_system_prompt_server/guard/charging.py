"""What each call costs its client's share of the event loop (shares.py), as the `shares`
interception meters it: the time of its steps, what gRPC does around them that no step sees
(`CALL_S` a call, `MESSAGE_S` a message the client sends on a stream or is sent on a watch,
`WIRE_S_PER_BYTE` for a unary call's bytes), and its turn before each call starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from ..wire import Behaviour, Context, ContextAround, Method
from .clients import client_of
from .paying import LARGE_RESPONSE_BYTES, PAYER, Payer
from .shares import Shares, share_key

# What gRPC does around the servicer's steps on the loop's thread, which no step sees: per-host
# estimates, measured on one 2-core machine (the hostile soak's, 2026-12-01), not constants of
# gRPC; a faster host spends less, so they overcharge there evenly, which keeps shares fair.
# Each byte of a request or response (receiving, copying into Python, sending): 3 MiB
# requests, refused by their size at once, took 1.75 ms of the loop per MiB.
WIRE_S_PER_BYTE = 1.75e-3 / (1 << 20)
# A call (its metadata, the handler's task, the response and the status): 8,000 cached
# Assembles took 1.89 s of the loop and their steps 49 ms; refused Disposes, 1.86 s beyond.
CALL_S = 230e-6
# A message a stream reads or writes: 8,000 small session messages took 0.91 s of the loop
# beyond their steps; 8,000 changes written to a watcher, 0.8 s.
MESSAGE_S = 100e-6


def wire_s(size: int) -> float:
    """What moving `size` bytes through gRPC costs the sidecar, as time on its loop."""
    return size * WIRE_S_PER_BYTE


def sharing(shares: Shares, anonymous: bool = False) -> Callable[[Method, Behaviour], Behaviour]:
    """The `shares` interception: every method's calls (SystemPromptService's, health's,
    reflection's) made to wait for their client's share, and metered against it: their
    steps; gRPC's work for the call (`CALL_S`) and for each message the client sends on its
    stream, or is sent on a stream it asked for alone (a watch, a listing, reflection's
    answers; `MESSAGE_S`); and the bytes of a unary call's request and encoded response.
    With `anonymous` (credentials are configured), a call that no credential or address
    tells apart is charged to `ANONYMOUS` (a refusal too: it is refused inside its share).
    The call's client pays for what it queues on others' streams too (`paying.PAYER`), and
    a response over `LARGE_RESPONSE_BYTES` waits for its turn before gRPC sends it."""

    def around(method: Method, behaviour: Behaviour) -> Behaviour:
        streams = method.client_streaming or method.server_streaming
        # the messages of a session or listener stream are mostly for others' calls
        # (invocations): they cost the calls that ask, not the stream's client
        writes = not (method.ours and method.client_streaming)

        async def in_turn(request: Any, context: Context) -> Any:
            key = share_key(client_of(context.peer()), anonymous)
            if key is None:
                return await behaviour(request, context)
            try:
                await shares.turn(key, starting=True)
            finally:  # counted before its steps, for the next one waiting; a deadline
                # that ended the wait did not spare gRPC its work
                shares.charge(key, CALL_S + wire_s(_size(request)))
            PAYER.set(Payer(shares, key))  # what it queues on others' streams: paying.py
            if streams:  # a unary call reads and writes no message through its context
                context = _MeteredStream(context, lambda: shares.charge(key, MESSAGE_S), writes)
                return await shares.metered(key, behaviour(request, context))
            # a stream's work is judged message by message; a unary call's, before it starts
            with shares.running_call(key):
                response = await shares.metered(key, behaviour(request, context))
                if isinstance(response, bytes):
                    shares.charge(key, wire_s(len(response)))
                    if len(response) > LARGE_RESPONSE_BYTES:  # sent in its client's turn
                        await shares.turn(key)
            return response

        return in_turn

    return around


class _MeteredStream(ContextAround):
    """A call's context whose messages read cost its client `MESSAGE_S` each, and those
    written too when `writes` (a stream the client asked for alone)."""

    def __init__(self, context: Context, charge: Callable[[], None], writes: bool) -> None:
        super().__init__(context)
        self._charge = charge
        self._writes = writes

    async def read(self) -> Any:
        message = await self._context.read()
        self._charge()
        return message

    async def write(self, message: Any) -> None:
        if self._writes:
            self._charge()
        await self._context.write(message)


def _size(request: Any) -> int:
    """A unary request's bytes (its message, when the policy parsed it); 0 for a stream."""
    if isinstance(request, bytes):
        return len(request)
    return request.ByteSize() if isinstance(request, Message) else 0
