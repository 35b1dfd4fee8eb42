"""connect(), the client, scope handles and disposers."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Generator, Mapping
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._changes import ChangeStream
from ._convert import assembly_from_proto, context_to_proto, tools_to_proto
from ._listeners import Listener, ListenerStream
from ._session import Session
from .errors import SystemPromptError, error_from_rpc
from .types import AssembleContext, PromptAssembly, RenderedPrompt, ToolProviderResult, ToolSchema

TextSource = str | Callable[[AssembleContext], str | Awaitable[str]]
VariableSource = str | None | Callable[[AssembleContext], str | None | Awaitable[str | None]]
ToolsSource = (
    list[ToolSchema]
    | ToolProviderResult
    | Callable[[AssembleContext], ToolProviderResult | list[ToolSchema] | Awaitable[Any]]
)


class Disposer:
    """`await off()` disposes one registration; calling it again does nothing."""

    def __init__(self, dispose: Callable[[], Awaitable[None]]) -> None:
        self._dispose = dispose
        self._done = False

    @property
    def disposed(self) -> bool:
        return self._done

    async def __call__(self) -> None:
        if self._done:
            return
        self._done = True
        await self._dispose()


class _Registrar:
    """The registration methods shared by the client (global layer) and scope handles."""

    def __init__(self, session: Session, scope_id: str) -> None:
        self._session = session
        self._scope_id = scope_id

    async def section(
        self, name: str, order: float, text: TextSource, *, complete: bool = False
    ) -> Disposer:
        """Contribute a prompt section; `text` is a string or a provider of one."""
        request = pb.RegisterSectionRequest(
            session_id=self._session.id,
            scope_id=self._scope_id,
            name=name,
            order=_order(order),
            complete=complete,
        )
        key = self._source(request, "text", text)
        reply = await self._register(self._session.stub.RegisterSection, request, key)
        return self._disposer(reply.registration_id, key)

    async def context(self, name: str, order: float, text: TextSource) -> Disposer:
        """Contribute an ordered runtime context; `text` is a string or a provider."""
        request = pb.RegisterContextRequest(
            session_id=self._session.id, scope_id=self._scope_id, name=name, order=_order(order)
        )
        key = self._source(request, "text", text)
        reply = await self._register(self._session.stub.RegisterContext, request, key)
        return self._disposer(reply.registration_id, key)

    async def suppress_runtime_context(self) -> Disposer:
        """Suppress runtime context here until the returned disposer runs."""
        request = pb.SuppressRuntimeContextRequest(
            session_id=self._session.id, scope_id=self._scope_id
        )
        reply = await self._register(self._session.stub.SuppressRuntimeContext, request, None)
        return self._disposer(reply.registration_id, None)

    async def tools(self, provider: ToolsSource) -> Disposer:
        """Contribute tool schemas: a list, a ToolProviderResult, or a provider of one."""
        request = pb.RegisterToolsRequest(session_id=self._session.id, scope_id=self._scope_id)
        key = None
        if callable(provider):
            key = self._session.add_provider(provider)
            request.dynamic.provider_key = key
            request.name = getattr(provider, "__qualname__", "")
        else:
            request.result.CopyFrom(tools_to_proto(provider))
        reply = await self._register(self._session.stub.RegisterTools, request, key)
        return self._disposer(reply.registration_id, key)

    async def variable(self, name: str, value: VariableSource) -> Disposer:
        """Contribute {{name}}: a value, None (no value), or a provider of either."""
        request = pb.RegisterVariableRequest(
            session_id=self._session.id, scope_id=self._scope_id, name=name
        )
        key = None
        if value is None:
            request.no_value.SetInParent()
        else:
            key = self._source(request, "value", value)
        reply = await self._register(self._session.stub.RegisterVariable, request, key)
        return self._disposer(reply.registration_id, key)

    async def on_assemble(
        self, listener: Listener, prepend: bool = False, global_: bool = False
    ) -> Disposer:
        """Install a waterfall listener: `async def listener(assembly, context, next)`."""
        self._session.check_open()
        stream = ListenerStream(self._session.stub, listener)
        registration_id = await stream.start(self._session.id, self._scope_id, prepend, global_)

        async def dispose() -> None:
            await self._dispose_id(registration_id)
            await stream.close()

        return Disposer(dispose)

    def _source(self, request: Any, field: str, value: object) -> str | None:
        if callable(value):
            key = self._session.add_provider(value)
            request.dynamic.provider_key = key
            return key
        if not isinstance(value, str):
            raise SystemPromptError(
                f"{field} must be a str or a callable, not {type(value).__name__}",
                grpc.StatusCode.INVALID_ARGUMENT,
            )
        setattr(request, field, value)
        return None

    async def _register(self, method: Any, request: Any, key: str | None) -> Any:
        try:
            return await self._session.call(method, request)
        except BaseException:
            if key is not None:
                self._session.drop_provider(key)
            raise

    def _disposer(self, registration_id: str, key: str | None) -> Disposer:
        async def dispose() -> None:
            await self._dispose_id(registration_id)
            if key is not None:
                self._session.drop_provider(key)

        return Disposer(dispose)

    async def _dispose_id(self, registration_id: str) -> None:
        if self._session.closed:
            return  # the session's end disposed it already
        request = pb.DisposeRequest(session_id=self._session.id, registration_id=registration_id)
        try:
            await self._session.call(self._session.stub.Dispose, request)
        except SystemPromptError as error:
            if error.code != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: gone already
                raise


class Scope(_Registrar):
    """A handle on a scope key: registrations land in that scope's layer."""

    def __init__(self, session: Session, key: str, parent: str | None, scope_id: str) -> None:
        super().__init__(session, scope_id)
        self.key = key
        self.parent = parent
        self._disposer_fn = self._disposer(scope_id, None)

    async def dispose(self) -> None:
        """Close the handle and dispose everything registered through it."""
        await self._disposer_fn()


class Client(_Registrar):
    """A session with the sidecar; registrations made here are global."""

    def __init__(self, session: Session) -> None:
        super().__init__(session, "")

    @property
    def session_id(self) -> str:
        return self._session.id

    async def scope(self, key: str, parent: str | None = None) -> Scope:
        """Open a handle on scope `key`, optionally binding its parent."""
        request = pb.OpenScopeRequest(session_id=self._session.id, key=key, parent_key=parent or "")
        reply = await self._session.call(self._session.stub.OpenScope, request)
        return Scope(self._session, key, parent, reply.scope_id)

    async def assemble(
        self,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> PromptAssembly:
        """Assemble the prompt for `scope` with `fields` passed to providers and listeners."""
        reply = await self._assemble(scope, fields, timeout, render=False)
        return assembly_from_proto(reply.assembly)

    async def render(
        self,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> RenderedPrompt:
        """Assemble and render on the sidecar (raises RenderError like render_prompt)."""
        reply = await self._assemble(scope, fields, timeout, render=True)
        return RenderedPrompt(
            reply.rendered.prompt,
            reply.rendered.context_snapshot,
            assembly_from_proto(reply.assembly),
        )

    async def watch_changes(self) -> ChangeStream:
        """Subscribe to change events; subscribed when this returns."""
        self._session.check_open()
        call = self._session.stub.WatchChanges(pb.WatchChangesRequest())
        try:
            first = await call.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if first is grpc.aio.EOF:
            raise SystemPromptError("the sidecar closed the change stream", await call.code())
        return ChangeStream(call, first.subscribed.revision)

    async def close(self) -> None:
        """End the session; the sidecar disposes everything it registered."""
        await self._session.close()

    async def _assemble(
        self,
        scope: str | None,
        fields: Mapping[str, Any] | None,
        timeout: float | None,
        render: bool,
    ) -> pb.AssembleResponse:
        request = pb.AssembleRequest(context=context_to_proto(scope, fields), render=render)
        return await self._session.call(self._session.stub.Assemble, request, timeout=timeout)


class _Connecting:
    """What connect() returns: await it, or use it with `async with`."""

    def __init__(self, address: str, client_name: str | None) -> None:
        self._address = address
        self._client_name = client_name or f"python-{os.getpid()}"
        self._client: Client | None = None

    async def _connect(self) -> Client:
        session = Session(grpc.aio.insecure_channel(self._address))
        try:
            await session.open(self._client_name)
        except BaseException:
            await session.channel.close()
            raise
        return Client(session)

    def __await__(self) -> Generator[Any, None, Client]:
        return self._connect().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._connect()
        return self._client

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.close()


def connect(address: str, *, client_name: str | None = None) -> _Connecting:
    """Open a session with the sidecar at `address` (HOST:PORT or unix:PATH)."""
    return _Connecting(address, client_name)


def _order(order: float) -> float:
    if isinstance(order, bool) or not isinstance(order, int | float):
        raise SystemPromptError(
            f"order must be a number, not {type(order).__name__}", grpc.StatusCode.INVALID_ARGUMENT
        )
    return float(order)
