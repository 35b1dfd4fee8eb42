"""A waterfall listener's stream: invocations in, next() and results out."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import assembly_from_proto, assembly_to_proto, context_from_proto
from .errors import SystemPromptError, error_from_rpc
from .types import AssembleContext, PromptAssembly

NextFn = Callable[..., Awaitable[PromptAssembly]]
Listener = Callable[[PromptAssembly, AssembleContext, NextFn], Awaitable[PromptAssembly]]


def listener_name(listener: object) -> str:
    return str(getattr(listener, "__qualname__", None) or type(listener).__name__)


class ListenerStream:
    """Runs one listener for every invocation the sidecar sends."""

    def __init__(self, stub: Any, listener: Listener) -> None:
        self._stub = stub
        self._listener = listener
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._next_results: dict[int, asyncio.Future[pb.PromptAssembly]] = {}

    async def start(self, session_id: str, scope_id: str, prepend: bool, global_: bool) -> str:
        """Install the listener; returns its registration id."""
        self._call = self._stub.Listen()
        start = pb.ListenStart(
            session_id=session_id,
            scope_id=scope_id,
            prepend=prepend,
            name=listener_name(self._listener),
            **{"global": global_},
        )
        try:
            await self._call.write(pb.ListenRequest(start=start))
            first = await self._call.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if first is grpc.aio.EOF:
            raise SystemPromptError(
                "the sidecar closed the listener stream", await self._call.code()
            )
        self._reader = asyncio.create_task(self._read())
        return str(first.registered.registration_id)

    async def close(self) -> None:
        for task in self._running.values():
            task.cancel()
        if self._call is not None:
            self._call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _read(self) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.CancelledError):
            while (message := await self._call.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "invocation":
                    self._start(message.invocation)
                elif kind == "next_result":
                    waiting = self._next_results.get(message.next_result.invocation_id)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(message.next_result.assembly)
                elif kind == "cancel":
                    task = self._running.get(message.cancel.invocation_id)
                    if task is not None:
                        task.cancel()

    def _start(self, invocation: pb.ListenerInvocation) -> None:
        invocation_id = invocation.invocation_id
        task = asyncio.create_task(self._invoke(invocation))
        self._running[invocation_id] = task
        task.add_done_callback(lambda _: self._running.pop(invocation_id, None))

    async def _invoke(self, invocation: pb.ListenerInvocation) -> None:
        invocation_id = invocation.invocation_id
        assembly = assembly_from_proto(invocation.assembly)
        context = context_from_proto(invocation.context)
        called = False

        async def next_(handed: PromptAssembly | None = None) -> PromptAssembly:
            nonlocal called
            if called:
                raise SystemPromptError(
                    "next() may be called once per invocation", grpc.StatusCode.FAILED_PRECONDITION
                )
            called = True
            waiting = asyncio.get_running_loop().create_future()
            self._next_results[invocation_id] = waiting
            try:
                await self._write(
                    pb.ListenRequest(
                        next=pb.ListenerNext(
                            invocation_id=invocation_id,
                            assembly=assembly_to_proto(handed if handed is not None else assembly),
                        )
                    )
                )
                return assembly_from_proto(await waiting)
            finally:
                del self._next_results[invocation_id]

        try:
            result = await self._listener(assembly, context, next_)
            reply = pb.ListenRequest(
                result=pb.ListenerResult(
                    invocation_id=invocation_id, assembly=assembly_to_proto(result)
                )
            )
        except asyncio.CancelledError:
            return  # the sidecar abandoned this invocation
        except Exception as error:  # the listener's failure fails the assembly, not us
            reply = pb.ListenRequest(
                failure=pb.ListenerFailure(
                    invocation_id=invocation_id, message=f"{type(error).__name__}: {error}"
                )
            )
        await self._write(reply)

    async def _write(self, message: pb.ListenRequest) -> None:
        async with self._write_lock:  # one outstanding write per stream
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._call.write(message)
