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
from ._channel import TLS, call_metadata, open_channel
from ._connection import Connection, Record
from ._convert import assembly_from_proto, context_to_proto, report_from_proto, tools_to_proto
from ._listeners import Listener, label, listener_name
from .errors import error_from_rpc, invalid_value, stream_ended
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

    def __init__(self, connection: Connection, scope: Record | None) -> None:
        self._connection = connection
        self._scope = scope

    async def section(
        self, name: str, order: float, text: TextSource, *, complete: bool = False
    ) -> Disposer:
        """Contribute a prompt section; `text` is a string or a provider of one."""
        request = pb.RegisterSectionRequest(name=name, order=_order(order), complete=complete)
        return await self._register("RegisterSection", request, self._source(request, "text", text))

    async def context(self, name: str, order: float, text: TextSource) -> Disposer:
        """Contribute an ordered runtime context; `text` is a string or a provider."""
        request = pb.RegisterContextRequest(name=name, order=_order(order))
        return await self._register("RegisterContext", request, self._source(request, "text", text))

    async def suppress_runtime_context(self) -> Disposer:
        """Suppress runtime context here until the returned disposer runs."""
        return await self._register("SuppressRuntimeContext", pb.SuppressRuntimeContextRequest())

    async def tools(self, provider: ToolsSource) -> Disposer:
        """Contribute tool schemas: a list, a ToolProviderResult, or a provider of one."""
        request = pb.RegisterToolsRequest()
        key = None
        if callable(provider):
            key = self._connection.add_provider(provider)
            request.dynamic.provider_key = key
            request.name = label(getattr(provider, "__qualname__", ""))
        else:
            request.result.CopyFrom(tools_to_proto(provider))
        return await self._register("RegisterTools", request, key)

    async def variable(self, name: str, value: VariableSource) -> Disposer:
        """Contribute {{name}}: a value, None (no value), or a provider of either."""
        request = pb.RegisterVariableRequest(name=name)
        key = None
        if value is None:
            request.no_value.SetInParent()
        else:
            key = self._source(request, "value", value)
        return await self._register("RegisterVariable", request, key)

    async def on_assemble(
        self, listener: Listener, prepend: bool = False, global_: bool = False
    ) -> Disposer:
        """Install a waterfall listener: `async def listener(assembly, context, next)`."""
        start = pb.ListenStart(prepend=prepend, name=listener_name(listener))
        setattr(start, "global", global_)  # a Python keyword as a field name
        record = Record("Listen", start, scope=self._scope, listener=listener)
        await self._connection.register(record)
        return Disposer(lambda: self._connection.dispose(record))

    def _source(self, request: Any, field: str, value: object) -> str | None:
        if callable(value):
            key = self._connection.add_provider(value)
            request.dynamic.provider_key = key
            return key
        if not isinstance(value, str):
            raise invalid_value(f"{field} must be a str or a callable, not {type(value).__name__}")
        setattr(request, field, value)
        return None

    async def _register(self, method: str, request: Any, key: str | None = None) -> Disposer:
        record = Record(method, request, scope=self._scope, provider_key=key)
        await self._connection.register(record)
        return Disposer(lambda: self._connection.dispose(record))


class Scope(_Registrar):
    """A handle on a scope key: registrations land in that scope's layer."""

    def __init__(
        self, connection: Connection, key: str, parent: str | None, record: Record
    ) -> None:
        super().__init__(connection, record)
        self.key = key
        self.parent = parent
        self._disposer = Disposer(lambda: connection.dispose(record))

    async def dispose(self) -> None:
        """Close the handle and dispose everything registered through it."""
        await self._disposer()


class Client(_Registrar):
    """A session with the sidecar; registrations made here are global."""

    def __init__(self, connection: Connection) -> None:
        super().__init__(connection, None)

    @property
    def session_id(self) -> str:
        """The current session's id (a new one after a reconnect)."""
        return self._connection.session_id

    @property
    def connected(self) -> bool:
        """False while the connection is down and being re-established."""
        return bool(self._connection.connected.is_set())

    async def scope(self, key: str, parent: str | None = None) -> Scope:
        """Open a handle on scope `key`, optionally binding its parent."""
        record = Record("OpenScope", pb.OpenScopeRequest(key=key, parent_key=parent or ""))
        await self._connection.register(record)
        return Scope(self._connection, key, parent, record)

    async def assemble(
        self,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        *,
        report: bool = False,
    ) -> PromptAssembly:
        """Assemble the prompt for `scope` with `fields` passed to providers and listeners.

        While the connection is down this fails fast with UNAVAILABLE, or, with
        a `timeout`, waits up to that long for the reconnect first. With
        `report`, `assembly.report` tells provenance, sizes and prefix stability.
        """
        reply = await self._assemble(scope, fields, timeout, render=False, report=report)
        return _assembly(reply)

    async def render(
        self,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        *,
        report: bool = False,
    ) -> RenderedPrompt:
        """Assemble and render on the sidecar (raises RenderError like render_prompt)."""
        reply = await self._assemble(scope, fields, timeout, render=True, report=report)
        return RenderedPrompt(
            reply.rendered.prompt, reply.rendered.context_snapshot, _assembly(reply)
        )

    async def watch_changes(self) -> ChangeStream:
        """Subscribe to change events; subscribed when this returns."""
        await self._connection.ready()
        call = self._connection.stub.WatchChanges(
            pb.WatchChangesRequest(), metadata=self._connection.metadata
        )
        try:
            first = await call.read()
        except grpc.RpcError as error:
            raise error_from_rpc(error) from None
        if first is grpc.aio.EOF:
            raise stream_ended("it closed the change stream", await call.code())
        return ChangeStream(call, first.subscribed.revision)

    async def close(self) -> None:
        """End the session; the sidecar disposes everything it registered."""
        await self._connection.close()

    async def _assemble(
        self,
        scope: str | None,
        fields: Mapping[str, Any] | None,
        timeout: float | None,
        render: bool,
        report: bool,
    ) -> pb.AssembleResponse:
        context = context_to_proto(scope, fields)
        request = pb.AssembleRequest(context=context, render=render, report=report)
        reply: pb.AssembleResponse = await self._connection.call(
            self._connection.stub.Assemble, request, timeout=timeout
        )
        return reply


class _Connecting:
    """What connect() returns: await it, or use it with `async with`."""

    def __init__(self, address: str, client_name: str, token: str | None, tls: TLS | None) -> None:
        self._address = address
        self._client_name = client_name
        self._token = token
        self._tls = tls
        self._client: Client | None = None

    async def _connect(self) -> Client:
        channel = open_channel(self._address, self._tls)
        connection = Connection(channel, self._client_name, call_metadata(self._token))
        try:
            await connection.open()
        except BaseException:
            await channel.close()
            raise
        return Client(connection)

    def __await__(self) -> Generator[Any, None, Client]:
        return self._connect().__await__()

    async def __aenter__(self) -> Client:
        self._client = await self._connect()
        return self._client

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._client is not None:
            await self._client.close()


def connect(
    address: str,
    *,
    client_name: str | None = None,
    token: str | None = None,
    tls: TLS | None = None,
) -> _Connecting:
    """Open a session with the sidecar at `address` (HOST:PORT or unix:PATH).

    `token` is sent as `authorization: Bearer <token>` on every call; `tls`
    switches to TLS (mutual TLS when it carries a client certificate).
    """
    return _Connecting(address, client_name or f"python-{os.getpid()}", token, tls)


def _assembly(reply: pb.AssembleResponse) -> PromptAssembly:
    assembly = assembly_from_proto(reply.assembly)
    if reply.HasField("report"):
        assembly.report = report_from_proto(reply.report)
    return assembly


def _order(order: float) -> float:
    if isinstance(order, bool) or not isinstance(order, int | float):
        raise invalid_value(f"order must be a number, not {type(order).__name__}")
    return float(order)
