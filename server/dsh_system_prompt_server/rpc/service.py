"""The gRPC servicer: messages in, registry calls, messages out, errors as statuses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable
from typing import Any, Protocol, TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import Reason, RenderFailure, render_context_snapshot, render_prompt
from google.protobuf.message import Message

from ..registry import (
    AssembleContext,
    Assembly,
    Failure,
    Registration,
    RegistryError,
    ServiceError,
    Status,
    Subscription,
)
from ..registry.assembly import Plan
from ..registry.callback_cache import context_key
from ..reports.history import HistoryKey
from ..reports.report import build_report
from ..telemetry.logs import logger
from ..telemetry.metrics import ASSEMBLY_FAILURE_REASONS
from .convert import (
    assemble_response,
    context_from_proto,
    history_entry_to_proto,
    history_key_from_proto,
    history_to_proto,
    layout_from_proto,
    report_to_proto,
    text_from_proto,
    tools_from_proto,
    update_value_from_proto,
    variable_from_proto,
)
from .gate import Gate
from .state import ServerState
from .status import abort
from .streams.sessions import Session

Reply = TypeVar("Reply")
_log = logger("service")
Opened = TypeVar("Opened")


class Context(Protocol):
    """What the service uses of grpc.aio.ServicerContext (grpcio ships no typing)."""

    async def read(self) -> object: ...

    async def write(self, message: Message) -> None: ...

    def time_remaining(self) -> float | None: ...

    def peer(self) -> str: ...


class _Owned(Protocol):
    """A registration request: it names its session and, optionally, a scope handle."""

    session_id: str
    scope_id: str


class SystemPromptService(pb_grpc.SystemPromptServiceServicer):
    """Translates the wire contract to registry calls; holds no semantics of its own."""

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
        def register(session: Session, handle: str | None) -> Registration[Any]:
            text = text_from_proto(request, session)
            return self._state.registry.register_section(
                session.id, handle, request.name, request.order, text, request.complete
            )

        return await self._register(context, request, register, pb.RegisterSectionResponse)

    async def RegisterContext(
        self, request: pb.RegisterContextRequest, context: Context
    ) -> pb.RegisterContextResponse:
        def register(session: Session, handle: str | None) -> Registration[Any]:
            text = text_from_proto(request, session)
            return self._state.registry.register_context(
                session.id, handle, request.name, request.order, text
            )

        return await self._register(context, request, register, pb.RegisterContextResponse)

    async def SuppressRuntimeContext(
        self, request: pb.SuppressRuntimeContextRequest, context: Context
    ) -> pb.SuppressRuntimeContextResponse:
        def register(session: Session, handle: str | None) -> Registration[Any]:
            return self._state.registry.suppress_runtime_context(session.id, handle)

        reply = pb.SuppressRuntimeContextResponse
        return await self._register(context, request, register, reply)

    async def RegisterTools(
        self, request: pb.RegisterToolsRequest, context: Context
    ) -> pb.RegisterToolsResponse:
        def register(session: Session, handle: str | None) -> Registration[Any]:
            tools = tools_from_proto(request, session)
            return self._state.registry.register_tools(session.id, handle, tools, request.name)

        return await self._register(context, request, register, pb.RegisterToolsResponse)

    async def RegisterVariable(
        self, request: pb.RegisterVariableRequest, context: Context
    ) -> pb.RegisterVariableResponse:
        def register(session: Session, handle: str | None) -> Registration[Any]:
            value = variable_from_proto(request, session)
            return self._state.registry.register_variable(session.id, handle, request.name, value)

        return await self._register(context, request, register, pb.RegisterVariableResponse)

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
            value = update_value_from_proto(request)
            self._state.registry.update(session.id, request.registration_id, value)
            return pb.UpdateResponse(revision=self._state.registry.revision)

        return await self._unary(context, update)

    # -- assembly ---------------------------------------------------------------------

    # Answers the response's encoding: handlers.passthrough sends it as is.
    async def Assemble(self, request: pb.AssembleRequest, context: Context) -> bytes:  # type: ignore[override]
        try:
            with self._state.gate.call(), self._state.metrics.assemble_seconds.time():
                return await self._assemble(request, context)
        except Failure as error:
            if error.reason in ASSEMBLY_FAILURE_REASONS:
                self._state.metrics.assembly_failures.labels(error.reason).inc()
            await abort(context, error)

    async def _assemble(self, request: pb.AssembleRequest, context: Context) -> bytes:
        assemble_context = context_from_proto(request.context)
        plan = self._state.registry.plan(assemble_context.scope)
        key = None if request.report else self._response_key(plan, assemble_context, request)
        cached = None if key is None else self._state.responses.get(key)
        if cached is not None:
            return cached  # a static (or all-cached) plan's response, encoded once
        remaining = context.time_remaining()
        deadline = None if remaining is None else asyncio.get_running_loop().time() + remaining
        assembly = await self._state.registry.run(
            plan, assemble_context, deadline, track=request.report
        )
        # before rendering: a report names a failing part, never fails
        report = self._report(request, plan, assembly) if request.report else None
        rendered = _rendered(assembly) if request.render else None
        response = assemble_response(assembly, plan.revision, rendered, report, plan.is_static)
        self._check_sendable(len(response), report is not None)
        if key is not None:
            self._state.responses.put(key, response)
        return response

    def _response_key(
        self, plan: Plan, context: AssembleContext, request: pb.AssembleRequest
    ) -> Hashable | None:
        """What a response is kept under: a static plan's by its revision (not by the
        caller's scope key: that is not kept); a plan whose every callback may be cached
        also by the cache's generation (and the context, if an answer depends on it);
        None when the response cannot be reused (a callback asked every time, or one
        whose answers expire: those are reused, but the assembly is rebuilt)."""
        if plan.is_static:
            return (plan.scope, plan.revision, request.render)
        policy = plan.policy
        if policy is None or policy.ttl_s is not None:
            return None
        generation = self._state.registry.callbacks.generation
        return (plan.scope, plan.revision, request.render, generation, context_key(policy, context))

    def _check_sendable(self, size: int, with_report: bool) -> None:
        """Fail with a reason here rather than let gRPC refuse to send it without one."""
        limit = self._state.max_message_bytes
        if size > limit:
            what = "assembly, with its report," if with_report else "assembly"
            raise ServiceError(
                Status.RESOURCE_EXHAUSTED,
                Reason.RESPONSE_TOO_LARGE,
                f"the {what} is {size} bytes, over the largest message the sidecar sends"
                f" ({limit} bytes, limits.max_message_bytes)",
            )

    def _report(
        self, request: pb.AssembleRequest, plan: Plan, assembly: Assembly
    ) -> pb.AssemblyReport:
        key = self._history_key(request.context.scope, request.report_key)
        revision = plan.revision
        layout = layout_from_proto(request.prefix_layout, self._state.prefix_layout)
        previous, evicted = self._state.reports.previous(key)
        report, current = build_report(assembly, self._state.tokenizer, layout, previous, evicted)
        remembered = self._state.reports.remember(key, report, current, revision)
        for forgotten, breakers in remembered.forgotten_keys:
            self._state.metrics.forget_key(forgotten.labels(), breakers)
        for part in remembered.forgotten_breakers:
            self._state.metrics.forget_breaker(key.labels(), part)
        stability = report.stability
        entry = remembered.entry
        breaker = stability.first_changed if entry.broke else ""
        recomputed = stability.recomputed
        self._state.metrics.cache_reported(
            key.labels(), recomputed.tokens, recomputed.bytes, breaker
        )
        if key.kind == "scope" and stability.has_previous and stability.prefix.bytes:
            ratio = stability.stable_bytes / stability.prefix.bytes
            self._state.metrics.prefix_stable(key.name, ratio)
        return report_to_proto(report, key)

    async def ReportUsage(
        self, request: pb.ReportUsageRequest, context: Context
    ) -> pb.ReportUsageResponse:
        def observe() -> pb.ReportUsageResponse:
            key = self._history_key(request.scope, request.report_key)
            prompt = request.prompt_tokens if request.HasField("prompt_tokens") else None
            entry = self._state.reports.observe(key, request.cached_tokens, prompt)
            if entry is None:
                raise ServiceError(
                    Status.NOT_FOUND,
                    Reason.REPORT_NOT_FOUND,
                    f"no reported assembly for {key.describe()} to attach usage to"
                    " (assemble with report=True first)",
                )
            if entry.stable_tokens:
                ratio = request.cached_tokens / entry.stable_tokens
                self._state.metrics.cache_observed(key.labels(), ratio)
            return pb.ReportUsageResponse(entry=history_entry_to_proto(entry))

        return await self._unary(context, observe)

    async def GetCacheHistory(
        self, request: pb.GetCacheHistoryRequest, context: Context
    ) -> pb.GetCacheHistoryResponse:
        def history() -> pb.GetCacheHistoryResponse:
            key = self._history_key(request.scope, request.report_key)
            kept, evicted = self._state.reports.get(key)
            return pb.GetCacheHistoryResponse(history=history_to_proto(key, kept, evicted))

        return await self._unary(context, history)

    def _history_key(self, scope: str, report_key: str) -> HistoryKey:
        self._state.registry.limits.check_name("report key", report_key)
        self._state.registry.limits.check_name("scope", scope)
        return history_key_from_proto(scope, report_key)

    # -- change events ----------------------------------------------------------------

    # Reader/writer API (as OpenSession), so that each write is bounded in time.
    async def WatchChanges(  # type: ignore[override]
        self, request: pb.WatchChangesRequest, context: Context
    ) -> None:
        peer = context.peer()
        subscription = await self._unary(
            context, lambda: self._open_watch(peer, lambda: self._state.watches.subscribe(request))
        )
        changes = self._state.watches.changes(subscription, request.features)
        await self._serve_watch(context, peer, subscription, changes)

    async def ListRegistrations(
        self, request: pb.ListRegistrationsRequest, context: Context
    ) -> AsyncIterator[pb.ListRegistrationsResponse]:
        for batch in await self._unary(context, lambda: self._state.watches.listing(request)):
            yield batch

    # Reader/writer API, as WatchChanges.
    async def WatchPrompt(  # type: ignore[override]
        self, request: pb.WatchPromptRequest, context: Context
    ) -> None:
        peer = context.peer()
        watch, subscription = await self._unary(
            context,
            lambda: self._open_watch(peer, lambda: self._state.watches.prompt_watch(request)),
        )
        prompts = self._state.watches.prompts(watch, subscription)
        await self._serve_watch(context, peer, subscription, prompts)

    def _open_watch(self, peer: str, start: Callable[[], Opened]) -> Opened:
        """Admit one more watch of `peer` and start it; nothing is held if it fails."""
        self._state.gate.check()
        self._state.watches.admit(peer)
        try:
            return start()
        except BaseException:
            self._state.watches.release(peer)
            raise

    async def _serve_watch(
        self,
        context: Context,
        peer: str,
        subscription: Subscription,
        responses: AsyncGenerator[Message, None],
    ) -> None:
        """Write a watch's responses until its peer stops taking them (then close it)."""
        try:
            async with contextlib.aclosing(responses):
                async for message in responses:
                    if not await self._written(context, message):
                        break
        finally:
            subscription.close()
            self._state.watches.release(peer)
        timeout = self._state.registry.settings.provider_timeout_s
        _log.warning("closed a watcher that did not read an event within %gs", timeout)
        self._state.metrics.peer_stalled("watcher")
        stalled = f"the watcher was closed: it did not read an event within {timeout:g}s"
        await abort(
            context, ServiceError(Status.RESOURCE_EXHAUSTED, Reason.STREAM_STALLED, stalled)
        )

    async def _written(self, context: Context, message: Message) -> bool:
        """Write `message`; False when the peer does not take it within provider_timeout_s."""
        try:
            async with asyncio.timeout(self._state.registry.settings.provider_timeout_s):
                await context.write(message)
        except TimeoutError:
            return False
        return True

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
        register: Callable[[Session, str | None], Registration[Any]],
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
        """Serve a bidi stream with its broker; a refusal before it starts is its status."""
        try:
            await serve(context, self._state.gate)
        except Failure as error:
            await abort(context, error)

    async def _unary(self, context: Context, action: Callable[[], Reply]) -> Reply:
        try:
            with self._state.gate.call():
                return action()
        except Failure as error:
            await abort(context, error)


def _rendered(assembly: Assembly) -> pb.RenderedPrompt:
    """The rendered prompt and snapshot; RENDER_FAILED when a section cannot be."""
    try:
        return pb.RenderedPrompt(
            prompt=render_prompt(assembly), context_snapshot=render_context_snapshot(assembly)
        )
    except RenderFailure as error:
        failure = RegistryError(Status.FAILED_PRECONDITION, Reason.RENDER_FAILED, str(error))
        raise failure from None


def _handle(scope_id: str) -> str | None:
    return scope_id or None
