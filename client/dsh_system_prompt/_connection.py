"""The connection: channel, current session, dynamic providers, and replay after a restart.

Every registration is kept as a `Record` (the request that made it). When the
session ends without the client closing it (the sidecar restarted, the network
dropped), the connection opens a new session with backoff and re-sends every
record in the original order, so assemblies after the restart equal those
before it. Disposers point at records, so they keep working across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import Reason

from ._channel import Metadata
from ._convert import context_from_proto, tools_to_proto
from ._listeners import Listener, ListenerStream
from .errors import SystemPromptError, error_from_rpc, stream_ended
from .types import AssembleContext

T = TypeVar("T")
Provider = Callable[[AssembleContext], Any]
_log = logging.getLogger("dsh_system_prompt")
_MAX_BACKOFF_S = 2.0


@dataclass(eq=False)
class Record:
    """One registration this client owns, as the request that makes it."""

    method: str  # the RPC that registers it, e.g. "RegisterSection"
    request: Any
    scope: Record | None = None
    provider_key: str | None = None
    listener: Listener | None = None
    registration_id: str = ""
    stream: ListenerStream | None = None


class Connection:
    """Owns the channel and the session stream; answers provider requests."""

    def __init__(self, channel: grpc.aio.Channel, client_name: str, metadata: Metadata) -> None:
        self.channel = channel
        self.metadata = metadata
        self.stub = pb_grpc.SystemPromptServiceStub(channel)
        self.client_name = client_name
        self.session_id = ""
        self.closed = False
        self.connected = asyncio.Event()
        self.records: dict[Record, None] = {}
        self._providers: dict[str, Provider] = {}
        self._keys = itertools.count(1)
        self._stream: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._answering: dict[int, asyncio.Task[None]] = {}

    # -- session lifecycle ------------------------------------------------------------

    async def open(self) -> None:
        """Open the first session; fails when the sidecar cannot be reached."""
        await self._open_session()
        self.connected.set()

    async def close(self) -> None:
        """End the session: the sidecar disposes everything it registered."""
        if self.closed:
            return
        self.closed = True
        self.connected.clear()
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        for record in self.records:
            if record.stream is not None:
                await record.stream.close()
        await self._end_session()
        await self.channel.close()

    async def _open_session(self) -> None:
        stream = self.stub.OpenSession(metadata=self.metadata)
        try:
            await stream.write(
                pb.OpenSessionRequest(start=pb.SessionStart(client_name=self.client_name))
            )
            opened = await stream.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if opened is grpc.aio.EOF:
            raise stream_ended("it ended the session stream before opening it", await stream.code())
        self._stream = stream
        self.session_id = opened.opened.session_id
        self._reader = asyncio.create_task(self._read(stream))

    async def _end_session(self) -> None:
        for task in self._answering.values():
            task.cancel()
        if self._stream is not None:
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._stream.done_writing()
        if self._reader is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), 5)
            self._reader.cancel()

    def _session_lost(self) -> None:
        if self.closed or self._reconnecting is not None:
            return
        self.connected.clear()
        self._reconnecting = asyncio.create_task(self._reconnect())

    async def _reconnect(self) -> None:
        delay = 0.05
        try:
            while not self.closed:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_BACKOFF_S)
                try:
                    await self._open_session()
                    await self._replay()
                except SystemPromptError as error:
                    _log.info("sidecar unavailable, retrying in %.2fs: %s", delay, error)
                    continue
                self.connected.set()
                _log.info(
                    "reconnected as a new session; %d registrations replayed", len(self.records)
                )
                return
        finally:
            self._reconnecting = None

    async def _replay(self) -> None:
        for record in list(self.records):
            if record.stream is not None:
                await record.stream.close()
                record.stream = None
        for record in list(self.records):
            if record in self.records:  # not disposed meanwhile
                await self._send(record)

    # -- calls ------------------------------------------------------------------------

    async def call(self, method: Callable[..., Awaitable[T]], request: Any, **options: Any) -> T:
        """Make a unary call for this session; gRPC failures become SystemPromptError."""
        await self.ready(options.get("timeout"))
        try:
            return await method(request, metadata=self.metadata, **options)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    async def ready(self, timeout: float | None = None) -> None:
        """Fail fast while reconnecting, or wait up to `timeout` when one is given."""
        self.check_open()
        if self.connected.is_set():
            return
        if timeout is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.connected.wait(), timeout)
            if self.connected.is_set():
                return
        raise SystemPromptError(
            "sidecar unavailable: the connection is down and being re-established",
            grpc.StatusCode.UNAVAILABLE,
            Reason.SIDECAR_UNAVAILABLE,
        )

    def check_open(self) -> None:
        if self.closed:
            raise SystemPromptError(
                "this client is closed: its session and registrations are gone",
                grpc.StatusCode.FAILED_PRECONDITION,
                Reason.SESSION_CLOSED,
            )

    async def register(self, record: Record) -> None:
        """Make a registration and keep it for replay; nothing is kept if it fails."""
        await self.ready()
        try:
            await self._send(record)
        except BaseException:
            if record.provider_key is not None:
                self._providers.pop(record.provider_key, None)
            raise
        self.records[record] = None

    async def dispose(self, record: Record) -> None:
        """Dispose `record` (and, for a scope, everything made through it)."""
        for child in [r for r in self.records if r.scope is record]:
            await self._forget(child)
        await self._forget(record)
        if self.closed or not self.connected.is_set() or not record.registration_id:
            return  # the sidecar has nothing of it now; nothing to replay later either
        request = pb.DisposeRequest(
            session_id=self.session_id, registration_id=record.registration_id
        )
        try:
            await self.call(self.stub.Dispose, request)
        except SystemPromptError as error:
            if error.code != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: gone already
                raise

    async def _forget(self, record: Record) -> None:
        self.records.pop(record, None)
        if record.provider_key is not None:
            self._providers.pop(record.provider_key, None)
        if record.stream is not None:
            await record.stream.close()
            record.stream = None

    async def _send(self, record: Record) -> None:
        request = record.request
        request.session_id = self.session_id
        if record.scope is not None:
            request.scope_id = record.scope.registration_id
        if record.listener is not None:
            stream = ListenerStream(self.stub, record.listener, self.metadata)
            record.registration_id = await stream.start(request)
            record.stream = stream
            return
        try:
            reply = await getattr(self.stub, record.method)(request, metadata=self.metadata)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        record.registration_id = getattr(reply, "registration_id", "") or reply.scope_id

    # -- dynamic providers ------------------------------------------------------------

    def add_provider(self, provider: Provider) -> str:
        """Keep `provider` here; the returned key is what the sidecar asks for."""
        key = f"p{next(self._keys)}"
        self._providers[key] = provider
        return key

    async def _read(self, stream: Any) -> None:
        try:
            while (message := await stream.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "provide":
                    self._start_answer(stream, message.provide)
                elif kind == "cancel":
                    task = self._answering.get(message.cancel.call_id)
                    if task is not None:
                        task.cancel()
        except grpc.RpcError:
            pass
        finally:
            if stream is self._stream:
                self._session_lost()

    def _start_answer(self, stream: Any, request: pb.ProvideRequest) -> None:
        task = asyncio.create_task(self._answer(stream, request))
        self._answering[request.call_id] = task
        task.add_done_callback(lambda _: self._answering.pop(request.call_id, None))

    async def _answer(self, stream: Any, request: pb.ProvideRequest) -> None:
        context = context_from_proto(request.context)
        answers = [pb.ProvidedValue(provider_key=call.provider_key) for call in request.calls]
        waiting = [
            self._finish(answer, call.kind, pending)
            for answer, call in zip(answers, request.calls, strict=True)
            if (pending := self._start(answer, call, context)) is not None
        ]
        if waiting:  # async providers run concurrently; sync ones have answered already
            await asyncio.gather(*waiting)
        response = pb.ProvideResponse(call_id=request.call_id, values=answers)
        async with self._write_lock:  # one outstanding write per stream
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await stream.write(pb.OpenSessionRequest(provided=response))

    def _start(
        self, answer: pb.ProvidedValue, call: pb.ProvideCall, context: AssembleContext
    ) -> Awaitable[Any] | None:
        """Call the provider: fill `answer` now, or return what to await for it."""
        try:
            provider = self._providers.get(call.provider_key)
            if provider is None:
                raise LookupError("the provider was disposed in this client")
            value = provider(context)
            if inspect.isawaitable(value):
                return value
            _fill(answer, call.kind, value)
        except Exception as error:  # the provider's failure fails the assembly, not us
            _fail(answer, error)
        return None

    async def _finish(self, answer: pb.ProvidedValue, kind: int, pending: Awaitable[Any]) -> None:
        try:
            _fill(answer, kind, await pending)
        except Exception as error:
            _fail(answer, error)


def _fail(answer: pb.ProvidedValue, error: Exception) -> None:
    answer.error.message = f"{type(error).__name__}: {error}"


def _fill(answer: pb.ProvidedValue, kind: int, value: Any) -> None:
    if kind == pb.PROVIDER_KIND_TOOLS:
        answer.tools.CopyFrom(tools_to_proto(value))
    elif kind == pb.PROVIDER_KIND_VARIABLE:
        if value is None:
            answer.no_value.SetInParent()
        elif isinstance(value, str):
            answer.variable_value = value
        else:
            raise TypeError(f"a variable provider must return str or None, not {value!r}")
    elif isinstance(value, str):
        answer.text = value
    else:
        raise TypeError(f"a text provider must return str, not {value!r}")
