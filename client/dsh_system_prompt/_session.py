"""The session: one channel, one session stream, and the client's dynamic providers."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from ._convert import context_from_proto, tools_to_proto
from .errors import SystemPromptError, error_from_rpc
from .types import AssembleContext

T = TypeVar("T")
Provider = Callable[[AssembleContext], Any]


class Session:
    """Owns the channel and the session stream; answers provider requests."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.SystemPromptServiceStub(channel)
        self.id = ""
        self.closed = False
        self._stream: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._providers: dict[str, Provider] = {}
        self._keys = itertools.count(1)
        self._answering: dict[int, asyncio.Task[None]] = {}
        self.ended = asyncio.Event()

    async def open(self, client_name: str) -> None:
        """Open the session stream and wait for the sidecar to confirm it."""
        self._stream = self.stub.OpenSession()
        try:
            await self._stream.write(
                pb.OpenSessionRequest(start=pb.SessionStart(client_name=client_name))
            )
            opened = await self._stream.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if opened is grpc.aio.EOF:
            raise SystemPromptError(
                "sidecar unavailable: it ended the session stream before opening it",
                await self._stream.code(),
            )
        self.id = opened.opened.session_id
        self._reader = asyncio.create_task(self._read())

    async def call(self, method: Callable[..., Awaitable[T]], request: Any, **options: Any) -> T:
        """Make a unary call for this session; gRPC failures become SystemPromptError."""
        self.check_open()
        try:
            return await method(request, **options)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None

    def check_open(self) -> None:
        if self.closed:
            raise SystemPromptError(
                "this client is closed: its session and registrations are gone",
                grpc.StatusCode.FAILED_PRECONDITION,
                "SESSION_CLOSED",
            )

    def add_provider(self, provider: Provider) -> str:
        """Keep `provider` here; the returned key is what the sidecar asks for."""
        key = f"p{next(self._keys)}"
        self._providers[key] = provider
        return key

    def drop_provider(self, key: str) -> None:
        self._providers.pop(key, None)

    async def close(self) -> None:
        """End the session: the sidecar disposes everything it registered."""
        if self.closed:
            return
        self.closed = True
        for task in self._answering.values():
            task.cancel()
        if self._stream is not None:
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._stream.done_writing()
            if self._reader is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(self._reader), 5)
                self._reader.cancel()
        await self.channel.close()

    async def _read(self) -> None:
        try:
            while (message := await self._stream.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "provide":
                    self._start_answer(message.provide)
                elif kind == "cancel":
                    task = self._answering.get(message.cancel.call_id)
                    if task is not None:
                        task.cancel()
        except (grpc.RpcError, asyncio.CancelledError):
            pass
        finally:
            self.ended.set()

    def _start_answer(self, request: pb.ProvideRequest) -> None:
        task = asyncio.create_task(self._answer(request))
        self._answering[request.call_id] = task
        task.add_done_callback(lambda _: self._answering.pop(request.call_id, None))

    async def _answer(self, request: pb.ProvideRequest) -> None:
        context = context_from_proto(request.context)
        values = await asyncio.gather(*(self._evaluate(call, context) for call in request.calls))
        response = pb.ProvideResponse(call_id=request.call_id, values=values)
        async with self._write_lock:  # one outstanding write per stream
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._stream.write(pb.OpenSessionRequest(provided=response))

    async def _evaluate(self, call: pb.ProvideCall, context: AssembleContext) -> pb.ProvidedValue:
        answer = pb.ProvidedValue(provider_key=call.provider_key)
        provider = self._providers.get(call.provider_key)
        try:
            if provider is None:
                raise SystemPromptError(
                    "the provider was disposed in this client", grpc.StatusCode.NOT_FOUND
                )
            value = provider(context)
            if inspect.isawaitable(value):
                value = await value
            _fill(answer, call.kind, value)
        except Exception as error:  # the provider's failure fails the assembly, not us
            answer.error.message = f"{type(error).__name__}: {error}"
        return answer


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
