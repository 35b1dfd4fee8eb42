"""A long-lived stream's life on the sidecar's side: sessions, listeners and watches alike.

Every stream opens what it asks for (a session, a listener, a watch), writes through an
outbox that bounds what its peer may leave unread and how long one write may take, and
ends at the first of: the peer closes its side or fails, what it opened ends on its own
(a disposed listener), the peer stalls. Whatever the end, what it opened is closed; a
stalled peer is then logged, counted (`dsp_stalled_peers_total{kind}`) and told
RESOURCE_EXHAUSTED STREAM_STALLED (`stalled`). A callback stream (a session, a
listener) starts with a start message of its kind (`Broker`), queues what it sends,
and bounds in time the replies it awaits (`Replies`); a watch writes one message at a
time (`write_all`). A rule about how a stream opens, ends, stalls or is bounded is
changed here, or in the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncGenerator, Awaitable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import grpc.aio
from dsh_system_prompt_core import Reason
from google.protobuf.message import Message as ProtoMessage

from ...guard import Gate, Payer, payer, wire_s
from ...registry import Registry, ServiceError
from ...telemetry import Metrics, logger
from ...wire import bad_request
from .flag import Flag
from .outbox import Message, Outbox, OutboxLimits

if TYPE_CHECKING:
    from ...telemetry import Tracing

Out = TypeVar("Out", bound=Message)
Out_contra = TypeVar("Out_contra", contravariant=True)
In = TypeVar("In", bound=ProtoMessage)
In_contra = TypeVar("In_contra", contravariant=True)
R = TypeVar("R", bound=ProtoMessage)
_log = logger("streams")


class Stream(Protocol[Out_contra]):
    """The reader/writer half of a streaming call's servicer context."""

    async def read(self) -> object:
        """The next request, or grpc.aio.EOF once the client has closed its side."""
        ...

    async def write(self, message: Out_contra | bytes) -> None:
        """Write a message, or its encoding on a method whose serializer passes bytes on."""
        ...

    def peer(self) -> str:
        """The peer's address as gRPC names it, e.g. `ipv4:127.0.0.1:53210` or `unix:`."""
        ...


class Host(Protocol[In_contra]):
    """What a callback stream opened (a session, a listener), as its stream drives it."""

    @property
    def ended(self) -> Flag:
        """Set once it is over, whoever ended it: its stream ends then too."""
        ...

    @property
    def label(self) -> str:
        """How the sidecar's log names it."""
        ...

    def deliver(self, message: In_contra) -> None:
        """Take one message the peer sent after its start."""
        ...


H = TypeVar("H", bound=Host[Any])


class Broker(ABC, Generic[In, Out, H]):
    """One kind of callback stream: its start opens a host in the registry, and its end
    closes it."""

    kind: str  # the stall metric's label: "session", "listener"
    request: type[In]  # what the peer sends
    must_start: str  # BAD_STREAM's message for a stream that does not start with a start

    def __init__(
        self,
        registry: Registry,
        metrics: Metrics,
        outbox: OutboxLimits | None,
        tracing: Tracing | None,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._tracing = tracing  # None: the hosts' calls are not traced
        self.outbox_limits = outbox or OutboxLimits()  # for streams opened from now on

    async def serve(self, stream: Stream[Out], gate: Gate) -> None:
        """One stream, start to end: its start opens a host (through `gate`), the peer's
        messages go to it, and the first end of the stream, the host or the peer closes it.

        Raises a Failure before the host is opened (a bad start, a refusal), and
        STREAM_STALLED when the peer stopped reading (the host is closed).
        """
        first = await stream.read()
        if not isinstance(first, self.request) or not first.HasField("start"):
            raise bad_request(Reason.BAD_STREAM, self.must_start)
        outbox: Outbox[Out] = Outbox(stream.write, self.outbox_limits, self.peer_name(first))
        with gate.call():
            host, confirmation = self.open(first, outbox, stream.peer())
        try:
            outbox.send(confirmation)
            await run(outbox, _read(stream, self.request, host), host.ended)
        finally:
            self.close(host)
        if outbox.stalled.is_set():
            raise stalled(self._metrics, self.kind, host.label, outbox)

    @abstractmethod
    def peer_name(self, start: In) -> str:
        """How a stall's status names the peer: `the session`, `listener "name"`."""

    @abstractmethod
    def open(self, start: In, outbox: Outbox[Out], peer: str) -> tuple[H, Out]:
        """Open what `start` asks for; the host and the message that confirms it."""

    @abstractmethod
    def close(self, host: H) -> None:
        """The stream is over: release what it held."""


async def run(outbox: Outbox[Any], reading: Awaitable[object], ended: Flag) -> None:
    """Read the peer's messages (`reading`) while the outbox writes, until the first of:
    the reading ends, the host ends (`ended`), the peer stalls; raises what reading raised.
    One task reads; one future waits for the first end (a task for each end cost a
    connected session 3 KiB)."""
    task = asyncio.ensure_future(reading)
    over: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def end(_: object = None) -> None:
        if not over.done():
            over.set_result(None)

    task.add_done_callback(end)
    ended.on_set(end)
    outbox.stalled.on_set(end)
    try:
        await over
        if task.done():
            task.result()  # what ended the stream, if it failed
    finally:
        task.cancel()
        ended.forget(end)
        outbox.stalled.forget(end)


async def write_all(
    outbox: Outbox[Out], messages: AsyncGenerator[Out, None] | AsyncGenerator[bytes, None]
) -> None:
    """Write each of `messages` (or of their encodings) once the one before it is written
    (a watch's pace), until they end or the peer stalls."""
    async with contextlib.aclosing(messages):
        async for message in messages:
            written = await outbox.write(message)
            # an idle watch keeps no copy of its last message (for WatchPrompt, a whole
            # prompt: 256 watchers of a 3.5 MiB scope held 900 MiB between changes)
            del message
            if not written:
                return


def stalled(metrics: Metrics, kind: str, label: str, outbox: Outbox[Any]) -> ServiceError:
    """Log and count a peer closed for not reading its stream; the status it ends with."""
    _log.warning("closed %s %s: %s", kind, label, outbox.stall_reason)
    metrics.peer_stalled(kind)
    return outbox.stall_error()


async def _read(stream: Stream[Any], request: type[In], host: Host[In]) -> None:
    while (message := await stream.read()) is not grpc.aio.EOF:
        if isinstance(message, request):
            host.deliver(message)


class Ended(Exception):
    """The stream ended while a reply was awaited."""


class Replies(Generic[R]):
    """The replies a host awaits from its peer, by exchange id, each wait bounded in time.

    An exchange is opened before its request is sent, so that a reply read before anyone
    waits is kept; a reply to no open exchange is dropped. The stream's end fails every
    wait with `Ended`.
    """

    def __init__(self) -> None:
        self._open: dict[int, _Exchange[R]] = {}
        self._ended = False

    def open(self, key: int) -> None:
        """Open exchange `key` for the call being served: its client pays for reading the
        replies (`deliver`)."""
        self._open[key] = exchange = _Exchange[R](payer())
        if self._ended:
            exchange.end()

    def close(self, key: int) -> None:
        """The exchange is over (answered or abandoned): later replies to it are dropped."""
        self._open.pop(key, None)

    def deliver(self, key: int, reply: R) -> None:
        """Hand `reply` to exchange `key`, if it is open. The client whose call opened it
        pays for reading its bytes, as it pays for the request it answers (guard/paying.py):
        a burst's 240 KB answers were read in no call's step."""
        exchange = self._open.get(key)
        if exchange is not None:
            if exchange.payer is not None:  # sized only when someone pays
                exchange.payer.charge(wire_s(reply.ByteSize()))
            exchange.put(reply)

    async def next(self, key: int, timeout: float | None) -> R:
        """The exchange's next reply; TimeoutError after `timeout`, Ended once the stream has
        ended and no reply is left."""
        async with asyncio.timeout(timeout):
            return await self._open[key].get()

    def end(self) -> None:
        self._ended = True
        for exchange in self._open.values():
            exchange.end()


class _Exchange(Generic[R]):
    """One exchange's replies: kept in order, one waiter at a time."""

    def __init__(self, paying: Payer | None) -> None:
        self.payer = paying  # who pays for reading its replies
        self._replies: deque[R] = deque()
        self._waiter: asyncio.Future[R] | None = None
        self._ended = False

    def put(self, reply: R) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(reply)
        else:
            self._replies.append(reply)

    async def get(self) -> R:
        if self._replies:
            return self._replies.popleft()
        if self._ended:
            raise Ended
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def end(self) -> None:
        self._ended = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(Ended())
