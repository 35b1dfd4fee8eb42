"""connect(), the client and scope handles; registering and its handles are in `_registrar`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._cache_history import (
    CacheHistory,
    CacheHistoryEntry,
    entry_from_proto,
    history_from_proto,
    usage_from,
)
from ._changes import WATCH_FEATURES, ChangeStream
from ._channel import TLS, default_address, open_channel
from ._connection import CALL_TIMEOUT_S, Connection, not_ready, open_when_ready
from ._convert import (
    assembly_from_proto,
    context_to_proto,
    freeze_to_proto,
    layout_to_proto,
    report_from_proto,
    skipped_from_proto,
)
from ._local_cache import MAX_BYTES, LocalCache
from ._prompts import PromptStream
from ._registrar import Disposer, _Registrar
from ._replay import ScopeHandle
from ._snapshots import change_filter, list_registrations
from .errors import invalid_value
from .types import ChangeKind, PrefixLayout, PromptAssembly, RenderedPrompt, Snapshot, ToolFreeze


class Scope(_Registrar):
    """A handle on a scope key: registrations land in that scope's layer."""

    def __init__(
        self, connection: Connection, key: str, parent: str | None, record: ScopeHandle
    ) -> None:
        super().__init__(connection, record)
        self.key = key
        self.parent = parent
        self._disposer = Disposer(lambda: connection.dispose(record))

    async def dispose(self) -> None:
        """Close the handle and dispose everything registered through it."""
        await self._disposer()

    async def __aenter__(self) -> Scope:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.dispose()


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
        request = pb.OpenScopeRequest(key=key, parent_key=parent or "")
        record = ScopeHandle(request=request, rpc=self._connection.stub.OpenScope)
        await self._connection.register(record)
        return Scope(self._connection, key, parent, record)

    async def assemble(
        self,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        *,
        report: bool = False,
        report_key: str | None = None,
        prefix_layout: PrefixLayout | None = None,
        tool_freeze: ToolFreeze | None = None,
    ) -> PromptAssembly:
        """Assemble the prompt for `scope` with `fields` passed to providers and listeners.

        While the connection is down this fails fast with UNAVAILABLE, or, with
        a `timeout`, waits up to that long for the reconnect first. With
        `report`, `assembly.report` tells provenance, sizes and prefix stability,
        compared with the last report of `report_key` (default: the scope) and
        laid out in `prefix_layout` (default: the sidecar's). `tool_freeze` "hold" freezes
        the report key's tools, "release" releases them (docs/prompt-cache.md, "Freezing the
        tools"); it needs `report`.
        """
        local = self._connection.local
        if local is not None and not report and tool_freeze is None:
            return await self._assemble_locally(local, scope, fields, timeout)
        report_ = _Report(report, report_key, prefix_layout, tool_freeze)
        reply = await self._assemble(scope, fields, timeout, render=False, report=report_)
        return _assembly(reply)

    async def _assemble_locally(
        self,
        local: LocalCache,
        scope: str | None,
        fields: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> PromptAssembly:
        """The kept answer while it is the registry's; else asked for, and kept if it may be."""
        key = scope or ""
        context = context_to_proto(scope, fields)  # its fields_json keys a rules-only answer
        if self._connection.connected.is_set():
            kept = local.get(key, context.fields_json)
            if kept is not None:
                return kept
        ticket = local.ticket(key)
        reply = await self._assemble(
            scope, fields, timeout, render=False, report=_NO_REPORT, context=context
        )
        local.put(ticket, key, context.fields_json, reply)
        return _assembly(reply)

    async def render(
        self,
        scope: str | None = None,
        fields: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        *,
        report: bool = False,
        report_key: str | None = None,
        prefix_layout: PrefixLayout | None = None,
        tool_freeze: ToolFreeze | None = None,
    ) -> RenderedPrompt:
        """Assemble and render on the sidecar (raises RenderError like render_prompt)."""
        report_ = _Report(report, report_key, prefix_layout, tool_freeze)
        reply = await self._assemble(scope, fields, timeout, render=True, report=report_)
        return RenderedPrompt(
            reply.rendered.prompt, reply.rendered.context_snapshot, _assembly(reply)
        )

    async def cache_history(
        self, scope: str | None = None, *, report_key: str | None = None
    ) -> CacheHistory:
        """The prompt-cache history of `report_key`, or of `scope` when no key is named."""
        request = pb.GetCacheHistoryRequest(scope=scope or "", report_key=report_key or "")
        reply: pb.GetCacheHistoryResponse = await self._connection.call(
            self._connection.stub.GetCacheHistory, request
        )
        return history_from_proto(reply.history)

    async def report_usage(
        self,
        usage: Mapping[str, Any] | Any,
        scope: str | None = None,
        *,
        report_key: str | None = None,
    ) -> CacheHistoryEntry:
        """Tell the sidecar what the model server said about the last reported request.

        `usage` is the response's usage object (DeepSeek, Anthropic or OpenAI);
        the returned entry holds the predicted stable prefix and what was observed.
        """
        read = usage_from(usage)
        request = pb.ReportUsageRequest(
            scope=scope or "",
            report_key=report_key or "",
            cached_tokens=read.cached_tokens,
            prompt_tokens=read.prompt_tokens,
        )
        reply: pb.ReportUsageResponse = await self._connection.call(
            self._connection.stub.ReportUsage, request
        )
        return entry_from_proto(reply.entry)

    async def watch_changes(
        self,
        scope: str | None = None,
        *,
        ancestors: bool = False,
        kinds: Iterable[ChangeKind] | None = None,
        after_revision: int | None = None,
        incarnation: str | None = None,
    ) -> ChangeStream:
        """Subscribe to change events; subscribed when this returns.

        `scope` keeps that scope's layer only (with `ancestors`, also its
        ancestors' and the global layer); `kinds` keeps those kinds. With
        `after_revision` (and the `incarnation` it belongs to), the changes
        after it are replayed first, or a ChangesResynced says they cannot be.
        The stream resumes by itself after a restart or a dropped connection.
        """
        await self._connection.ready()
        request = pb.WatchChangesRequest(
            filter=change_filter(scope, ancestors, kinds),
            incarnation=incarnation or "",
            features=WATCH_FEATURES,
        )
        if after_revision is not None:
            request.after_revision = after_revision
        stream = ChangeStream(self._connection.stub, request, self._connection.call_timeout)
        await stream.start()
        return stream

    async def snapshot(
        self,
        scope: str | None = None,
        *,
        ancestors: bool = False,
        kinds: Iterable[ChangeKind] | None = None,
        values: bool = False,
    ) -> Snapshot:
        """The registrations now (filtered like `watch_changes`), with their values if asked."""
        await self._connection.ready()
        request = pb.ListRegistrationsRequest(
            filter=change_filter(scope, ancestors, kinds), include_values=values
        )
        return await list_registrations(
            self._connection.stub, request, self._connection.call_timeout
        )

    async def watch_prompt(
        self,
        scope: str | None = None,
        *,
        render: bool = False,
        prefix_layout: PrefixLayout | None = None,
    ) -> PromptStream:
        """Watch the prompt of `scope` as its static parts make it, change by change.

        Each PromptChange says what changed and whether it breaks the model
        server's prompt cache (`report.stability`); dynamic parts are
        placeholders, never evaluated.
        """
        await self._connection.ready()
        request = pb.WatchPromptRequest(
            scope=scope or "", render=render, prefix_layout=layout_to_proto(prefix_layout)
        )
        return PromptStream(self._connection.stub.WatchPrompt(request))

    async def close(self) -> None:
        """End the session; the sidecar disposes everything it registered."""
        await self._connection.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _assemble(
        self,
        scope: str | None,
        fields: Mapping[str, Any] | None,
        timeout: float | None,
        render: bool,
        report: _Report,
        context: pb.AssembleContext | None = None,
    ) -> pb.AssembleResponse:
        if context is None:
            context = context_to_proto(scope, fields)
        request = pb.AssembleRequest(
            context=context,
            render=render,
            report=report.wanted,
            report_key=report.key or "",
            prefix_layout=layout_to_proto(report.layout),
            tool_freeze=freeze_to_proto(report.freeze),
        )
        reply: pb.AssembleResponse = await self._connection.call(
            self._connection.stub.Assemble, request, timeout=timeout
        )
        return reply


@dataclass(frozen=True)
class _Report:
    """What an assembly asks of its report."""

    wanted: bool
    key: str | None
    layout: PrefixLayout | None
    freeze: ToolFreeze | None = None


_NO_REPORT = _Report(False, None, None)


class _Connecting:
    """What connect() returns: await it, or use it with `async with`."""

    def __init__(self, address: str, client_name: str, options: _ConnectOptions) -> None:
        self._address = address
        self._client_name = client_name
        self._options = options
        self._client: Client | None = None

    async def _connect(self) -> Client:
        options = self._options
        channel = open_channel(self._address, options.tls, options.token)
        connection = Connection(channel, self._client_name, options.call_timeout)
        try:
            if options.wait_for_ready:
                await open_when_ready(connection, self._address, options.ready_timeout())
            elif options.timeout is not None:
                async with asyncio.timeout(options.timeout):
                    await connection.open()
            else:
                await connection.open()
        except TimeoutError:
            await channel.close()
            raise not_ready(self._address, options.timeout) from None
        except BaseException:
            await channel.close()
            raise
        if options.local_cache:
            await _keep_locally(connection, options.local_cache_bytes)
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


@dataclass(frozen=True)
class _ConnectOptions:
    token: str | None
    tls: TLS | None
    wait_for_ready: bool
    timeout: float | None
    call_timeout: float
    local_cache: bool
    local_cache_bytes: int

    def ready_timeout(self) -> float:
        return READY_TIMEOUT_S if self.timeout is None else self.timeout


READY_TIMEOUT_S = 30.0  # wait_for_ready without a timeout still gives up, and says so


def connect(
    address: str | None = None,
    *,
    client_name: str | None = None,
    token: str | None = None,
    tls: TLS | None = None,
    wait_for_ready: bool = False,
    timeout: float | None = None,
    call_timeout: float = CALL_TIMEOUT_S,
    local_cache: bool = False,
    local_cache_bytes: int = MAX_BYTES,
) -> _Connecting:
    """Open a session with the sidecar at `address` (HOST:PORT or unix:PATH; default
    `$DSP_ADDRESS`, else 127.0.0.1:50051).

    `token` is sent as `authorization: Bearer <token>` on every call; `tls`
    switches to TLS (mutual TLS when it carries a client certificate). By
    default an unreachable sidecar fails at once (UNAVAILABLE); with
    `wait_for_ready=True` connecting waits for the sidecar to come up, for
    `timeout` seconds (30 without one), then fails UNAVAILABLE. `timeout`
    bounds connecting either way. `call_timeout` bounds what the sidecar answers
    at once (opening a session, listener or change stream, a registration, a
    disposal): past it the call fails UNAVAILABLE / SIDECAR_UNAVAILABLE and,
    for a registration or disposal, the client opens a new session and replays.
    With `local_cache=True`, `assemble()` (without a report) of a scope whose plan
    is all-static answers from a copy kept here, checked against the client's own
    change stream (see docs/protocol.md, "The local cache"); what it keeps is bounded by
    `local_cache_bytes` (its texts counted; 32 MiB), the least recently used dropped first.
    """
    if isinstance(local_cache_bytes, bool) or not isinstance(local_cache_bytes, int):
        raise invalid_value(f"local_cache_bytes must be a whole number, not {local_cache_bytes!r}")
    if local_cache_bytes < 1:
        raise invalid_value(f"local_cache_bytes must be at least 1, not {local_cache_bytes}")
    options = _ConnectOptions(
        token=token,
        tls=tls,
        wait_for_ready=wait_for_ready,
        timeout=timeout,
        call_timeout=call_timeout,
        local_cache=local_cache,
        local_cache_bytes=local_cache_bytes,
    )
    name = client_name or f"python-{os.getpid()}"
    return _Connecting(address or default_address(), name, options)


async def _keep_locally(connection: Connection, max_bytes: int) -> None:
    """Give `connection` its local cache, subscribed to the changes it may watch."""
    local = LocalCache(connection.stub, connection.call_timeout, max_bytes)
    try:
        await local.start()
    except BaseException:
        await connection.close()
        raise
    connection.local = local


def _assembly(reply: pb.AssembleResponse) -> PromptAssembly:
    assembly = assembly_from_proto(reply.assembly)
    if reply.HasField("report"):
        assembly.report = report_from_proto(reply.report)
    if reply.skipped:
        assembly.skipped = skipped_from_proto(reply.skipped)
    return assembly
