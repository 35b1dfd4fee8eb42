"""The gRPC servicer: one thin method per RPC, which translates its request and delegates to
the served state (registry calls, the assembler, the reporter, the streams' brokers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Protocol, TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from google.protobuf.message import Message

from ..guard import Gate, shown_steps
from ..registry import AnyRegistration, Failure
from ..wire import (
    SKIPPED_TRAILER,
    history_entry_to_proto,
    history_to_proto,
    skipped_trailer,
    text_from_proto,
    tools_from_proto,
    update_value_from_proto,
    variable_from_proto,
)
from .assemble import history_key
from .state import ServerState
from .streams import Session

Reply = TypeVar("Reply")


class Context(Protocol):
    """What the service uses of grpc.aio.ServicerContext (grpcio ships no typing)."""

    async def read(self) -> object: ...

    async def write(self, message: Message | bytes) -> None: ...

    def time_remaining(self) -> float | None: ...

    def peer(self) -> str: ...

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None: ...


class _Owned(Protocol):
    """A registration request: it names its session and, optionally, a scope handle."""

    session_id: str
    scope_id: str


class SystemPromptService(pb_grpc.SystemPromptServiceServicer):
    """Translates the wire contract to calls on the served state; holds no semantics of its own."""

    def __init__(self, state: ServerState) -> None:
        self._state = state

    # -- sessions ---------------------------------------------------------------------

    # The reader/writer API (context.read, context.write) returns None where the
    # generated base declares an iterator of responses.
    async def OpenSession(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.OpenSessionRequest], context: Context
    ) -> None:
        await self._stream(context, self._state.sessions.serve)

    # -- registrations ----------------------------------------------------------------

    async def RegisterSection(
        self, request: pb.RegisterSectionRequest, context: Context
    ) -> pb.RegisterSectionResponse:
        def register(session: Session, handle: str | None) -> AnyRegistration:
            text = text_from_proto(request, session)
            return self._state.registry.register_section(
                session.id, handle, request.name, request.order, text, request.complete
            )

        return await self._register(context, request, register, pb.RegisterSectionResponse)

    async def RegisterContext(
        self, request: pb.RegisterContextRequest, context: Context
    ) -> pb.RegisterContextResponse:
        def register(session: Session, handle: str | None) -> AnyRegistration:
            text = text_from_proto(request, session)
            return self._state.registry.register_context(
                session.id, handle, request.name, request.order, text
            )

        return await self._register(context, request, register, pb.RegisterContextResponse)

    async def SuppressRuntimeContext(
        self, request: pb.SuppressRuntimeContextRequest, context: Context
    ) -> pb.SuppressRuntimeContextResponse:
        def register(session: Session, handle: str | None) -> AnyRegistration:
            return self._state.registry.suppress_runtime_context(session.id, handle)

        reply = pb.SuppressRuntimeContextResponse
        return await self._register(context, request, register, reply)

    async def RegisterTools(
        self, request: pb.RegisterToolsRequest, context: Context
    ) -> pb.RegisterToolsResponse:
        def register(session: Session, handle: str | None) -> AnyRegistration:
            tools = tools_from_proto(request, session, self._state.registry.limits)
            return self._state.registry.register_tools(session.id, handle, tools, request.name)

        return await self._register(context, request, register, pb.RegisterToolsResponse)

    async def RegisterVariable(
        self, request: pb.RegisterVariableRequest, context: Context
    ) -> pb.RegisterVariableResponse:
        def register(session: Session, handle: str | None) -> AnyRegistration:
            value = variable_from_proto(request, session)
            return self._state.registry.register_variable(session.id, handle, request.name, value)

        return await self._register(context, request, register, pb.RegisterVariableResponse)

    async def RegisterRule(
        self, request: pb.RegisterRuleRequest, context: Context
    ) -> pb.RegisterRuleResponse:
        def register(session: Session, handle: str | None) -> AnyRegistration:
            return self._state.registry.add_rule(
                session.id,
                handle,
                request.name,
                request.rule,
                prepend=request.prepend,
                global_=getattr(request, "global"),  # a Python keyword: no attribute syntax
            )

        return await self._register(context, request, register, pb.RegisterRuleResponse)

    async def OpenScope(
        self, request: pb.OpenScopeRequest, context: Context
    ) -> pb.OpenScopeResponse:
        def open_scope() -> pb.OpenScopeResponse:
            session = self._state.sessions.get(request.session_id)
            handle = self._state.registry.open_scope(
                session.id, request.key, request.parent_key or None
            )
            return pb.OpenScopeResponse(scope_id=handle.id, revision=self._state.registry.revision)

        return await self._unary(context, open_scope)

    async def Dispose(self, request: pb.DisposeRequest, context: Context) -> pb.DisposeResponse:
        def dispose() -> pb.DisposeResponse:
            session = self._state.sessions.get(request.session_id)
            self._state.registry.dispose(session.id, request.registration_id)
            return pb.DisposeResponse(revision=self._state.registry.revision)

        return await self._unary(context, dispose)

    async def Update(self, request: pb.UpdateRequest, context: Context) -> pb.UpdateResponse:
        def update() -> pb.UpdateResponse:
            session = self._state.sessions.get(request.session_id)
            value = update_value_from_proto(request, self._state.registry.limits)
            self._state.registry.update(session.id, request.registration_id, value)
            return pb.UpdateResponse(revision=self._state.registry.revision)

        return await self._unary(context, update)

    # -- assembly ---------------------------------------------------------------------

    # Takes the request's bytes (handlers.RAW_REQUESTS) and answers the response's encoding
    # (handlers.passthrough sends it as is): the assembler refuses it by its size, answers it
    # from its bytes when they were answered before, else parses and assembles it.
    # Authorization (guard.auth) came first.
    async def Assemble(self, request: bytes, context: Context) -> bytes:  # type: ignore[override]
        state = self._state
        started = time.perf_counter()
        try:
            with state.gate.call():
                try:
                    deadline = _deadline(context)
                    answered = await state.assembler.answer(request, deadline, state.prefix_layout)
                finally:
                    state.metrics.assemble_seconds.observe(time.perf_counter() - started)
        except Failure as error:
            state.metrics.assembly_failed(error.reason)
            raise  # its status: handlers.ending
        if answered.skipped:
            trailer = skipped_trailer(answered.skipped)
            context.set_trailing_metadata(((SKIPPED_TRAILER, trailer),))
        return answered.response

    async def ReportUsage(
        self, request: pb.ReportUsageRequest, context: Context
    ) -> pb.ReportUsageResponse:
        def observe() -> pb.ReportUsageResponse:
            key = history_key(self._state.registry.limits, request.scope, request.report_key)
            prompt = request.prompt_tokens if request.HasField("prompt_tokens") else None
            entry = self._state.reporter.observe(key, request.cached_tokens, prompt)
            self._state.metrics.usage_observed(key, entry)
            return pb.ReportUsageResponse(entry=history_entry_to_proto(entry, shown_steps()))

        return await self._unary(context, observe)

    async def GetCacheHistory(
        self, request: pb.GetCacheHistoryRequest, context: Context
    ) -> pb.GetCacheHistoryResponse:
        def history() -> pb.GetCacheHistoryResponse:
            key = history_key(self._state.registry.limits, request.scope, request.report_key)
            kept, evicted = self._state.reports.get(key)
            shows = shown_steps()  # a step held outside the caller's scopes is named by its layer
            return pb.GetCacheHistoryResponse(history=history_to_proto(key, kept, evicted, shows))

        return await self._unary(context, history)

    # -- change events ----------------------------------------------------------------

    # Reader/writer API (as OpenSession), so that each write is bounded in time.
    async def WatchChanges(  # type: ignore[override]
        self, request: pb.WatchChangesRequest, context: Context
    ) -> None:
        await self._stream(context, partial(self._state.watches.serve_changes, request))

    # Reader/writer API, as WatchChanges: each batch is built when the last was taken.
    async def ListRegistrations(  # type: ignore[override]
        self, request: pb.ListRegistrationsRequest, context: Context
    ) -> None:
        await self._stream(context, partial(self._state.watches.serve_listing, request))

    # Reader/writer API, as WatchChanges.
    async def WatchPrompt(  # type: ignore[override]
        self, request: pb.WatchPromptRequest, context: Context
    ) -> None:
        await self._stream(context, partial(self._state.watches.serve_prompts, request))

    # -- listeners --------------------------------------------------------------------

    # Reader/writer API, as OpenSession.
    async def Listen(  # type: ignore[override]
        self, request_iterator: AsyncIterator[pb.ListenRequest], context: Context
    ) -> None:
        await self._stream(context, self._state.listeners.serve)

    # -- helpers ----------------------------------------------------------------------

    async def _register(
        self,
        context: Context,
        request: _Owned,
        register: Callable[[Session, str | None], AnyRegistration],
        reply: Callable[..., Reply],
    ) -> Reply:
        """Run one registration for the request's session and scope handle."""

        def run() -> Reply:
            session = self._state.sessions.get(request.session_id)
            entry = register(session, _handle(request.scope_id))
            return reply(registration_id=entry.id, revision=self._state.registry.revision)

        return await self._unary(context, run)

    async def _stream(
        self, context: Context, serve: Callable[[Context, Gate], Awaitable[None]]
    ) -> None:
        """Serve a stream with its broker; a refusal to open, or a stall that ends it, is its
        status (handlers.ending)."""
        await serve(context, self._state.gate)

    async def _unary(self, context: Context, action: Callable[[], Reply]) -> Reply:
        """`action`'s reply, within the gate; a Failure is the call's status (handlers.ending)."""
        with self._state.gate.call():
            return action()


def _deadline(context: Context) -> float | None:
    """The call's deadline on the event loop's clock; None when it has none."""
    remaining = context.time_remaining()
    return None if remaining is None else asyncio.get_running_loop().time() + remaining


def _handle(scope_id: str) -> str | None:
    return scope_id or None
