"""Registering: what a section, context, variable or tools may be, the handles a
registration returns, and the registration methods the client and scopes share."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import FEATURE_CALLBACK_CACHE, FEATURE_PART_SLOTS, FEATURE_TOOL_SLOTS

from ._callback_cache import Cache
from ._connection import Connection
from ._convert import failure_policy_to_proto, tools_to_proto
from ._listeners import Listener, label, listener_name
from ._replay import Contribution, ListenerRegistration, Registration, ScopeHandle
from ._rules import Rule, rule_spec
from ._updates import update_for
from .errors import invalid_value
from .types import AssembleContext, FailurePolicy, ToolProviderResult, ToolSchema

TextProvider = Callable[[AssembleContext], str | Awaitable[str]]
"""A dynamic section or context: asked for its text at every assembly."""
VariableProvider = Callable[[AssembleContext], str | None | Awaitable[str | None]]
"""A dynamic variable: asked for its value (None: no value) at every assembly."""
ToolsProvider = Callable[[AssembleContext], ToolProviderResult | list[ToolSchema] | Awaitable[Any]]
"""Dynamic tools: asked for a list or a ToolProviderResult at every assembly."""
TextSource = str | TextProvider
VariableSource = str | None | VariableProvider
ToolsSource = list[ToolSchema] | ToolProviderResult | ToolsProvider


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

    async def __aenter__(self) -> Disposer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self()


class Handle(Disposer):
    """A static registration's handle: `await off()` disposes it, like any disposer,
    and `await off.update(value)` replaces its value in place.

    Only the value changes (a section's or context's text, a variable's value
    or None, a tool list or ToolProviderResult); its name, order and owner stay.
    Other clients' assemblies see the old value or the new one, never neither,
    and watchers get one `updated` event. After a reconnect the latest value
    is what is registered again.
    """

    def __init__(self, connection: Connection, record: Contribution[Any]) -> None:
        super().__init__(lambda: connection.dispose(record))
        self._connection = connection
        self._record = record

    async def update(self, value: Any, timeout: float | None = None) -> int:
        """Replace the value; returns the registry's revision after the update.

        Raises like a registration would for a bad value; NOT_UPDATABLE for a
        registration made with a provider; while the connection is down, fails
        fast with UNAVAILABLE or waits up to `timeout` for the reconnect.
        """
        return await self._connection.update(
            self._record, update_for(self._record.request, value), timeout
        )

    async def invalidate(self) -> None:
        """Drop the sidecar's cached answers of this registration's provider (one made
        with `cache=`): assemblies that start once this returns ask it again. Nothing
        to do for a static value or a provider asked every time."""
        await self._connection.invalidate(self._record)


class ListenerHandle(Disposer):
    """A listener's handle: `await off()` removes it, and `await off.invalidate()` drops
    the sidecar's cached results of a listener installed with `cache=`."""

    def __init__(self, connection: Connection, record: ListenerRegistration) -> None:
        super().__init__(lambda: connection.dispose(record))
        self._connection = connection
        self._record = record

    async def invalidate(self) -> None:
        """Assemblies that start once this returns invoke the listener again."""
        await self._connection.invalidate(self._record)


class _Registrar:
    """The registration methods shared by the client (global layer) and scope handles."""

    def __init__(self, connection: Connection, scope: ScopeHandle | None) -> None:
        self._connection = connection
        self._stub = connection.stub
        self._scope = scope

    async def section(
        self,
        name: str,
        order: float,
        text: TextSource,
        *,
        complete: bool = False,
        cache: Cache | None = None,
        timeout_s: float | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> Handle:
        """Contribute a prompt section; `text` is a string or a provider of one (with
        `cache`, a provider whose answer the sidecar may reuse: see `Cache`; with
        `timeout_s`, one given that many seconds to answer instead of the sidecar's
        provider_timeout_s, up to its max_callback_timeout_s; with `failure_policy`
        FailurePolicy.IGNORE, one an assembly goes on without when it fails, for a
        provider that decorates, never one that filters: see docs/protocol.md)."""
        request = pb.RegisterSectionRequest(name=name, order=_order(order), complete=complete)
        record = Contribution(request=request, rpc=self._stub.RegisterSection)
        asked = _Asked(cache, timeout_s, failure_policy)
        return await self._register_text(record, "section", text, asked)

    async def context(
        self,
        name: str,
        order: float,
        text: TextSource,
        *,
        cache: Cache | None = None,
        timeout_s: float | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> Handle:
        """Contribute an ordered runtime context; `text` is a string or a provider
        (`cache`, `timeout_s` and `failure_policy` as for `section`)."""
        request = pb.RegisterContextRequest(name=name, order=_order(order))
        record = Contribution(request=request, rpc=self._stub.RegisterContext)
        asked = _Asked(cache, timeout_s, failure_policy)
        return await self._register_text(record, "context", text, asked)

    async def suppress_runtime_context(self) -> Disposer:
        """Suppress runtime context here until the returned disposer runs."""
        request = pb.SuppressRuntimeContextRequest()
        rpc = self._stub.SuppressRuntimeContext
        return await self._register(Contribution(request=request, rpc=rpc))

    async def tools(
        self,
        provider: ToolsSource,
        *,
        name: str | None = None,
        cache: Cache | None = None,
        timeout_s: float | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> Handle:
        """Contribute tool schemas: a list, a ToolProviderResult, or a provider of one.

        `name` labels it in errors, reports and traces (a provider's default: its function name);
        `cache`, `timeout_s` and `failure_policy` as for `section`.
        """
        request = pb.RegisterToolsRequest()
        source = None
        if callable(provider):
            request.name = name or label(getattr(provider, "__qualname__", ""))
            labelled = f'tools provider "{request.name}"'
            source = self._dynamic(provider, labelled, _Asked(cache, timeout_s, failure_policy))
            request.dynamic.CopyFrom(source)
        else:
            _Asked(cache, timeout_s, failure_policy).refuse_static()
            request.result.CopyFrom(tools_to_proto(provider))
            request.name = name or ""
        record = Contribution(request=request, rpc=self._stub.RegisterTools)
        return await self._register_value(record, source)

    async def variable(
        self,
        name: str,
        value: VariableSource,
        *,
        cache: Cache | None = None,
        timeout_s: float | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> Handle:
        """Contribute {{name}}: a value, None (no value), or a provider of either
        (`cache`, `timeout_s` and `failure_policy` as for `section`)."""
        request = pb.RegisterVariableRequest(name=name)
        labelled = f'variable provider "{name}"'
        source = None
        if value is None:
            _Asked(cache, timeout_s, failure_policy).refuse_static()
        else:
            source = self._source(
                value, "value", labelled, _Asked(cache, timeout_s, failure_policy)
            )
        if source is None:
            request.no_value.SetInParent()
        elif isinstance(source, str):
            request.value = source
        else:
            request.dynamic.CopyFrom(source)
        record = Contribution(request=request, rpc=self._stub.RegisterVariable)
        return await self._register_value(record, source)

    async def on_assemble(
        self,
        listener: Listener,
        prepend: bool = False,
        global_: bool = False,
        *,
        name: str | None = None,
        cache: Cache | None = None,
        timeout_s: float | None = None,
        failure_policy: FailurePolicy | None = None,
    ) -> ListenerHandle:
        """Install a waterfall listener: `async def listener(assembly, context, next)`.

        `name` labels it in errors, reports and traces (default: its function name).
        With `cache`, the sidecar may reuse its result for the same input assembly
        instead of invoking it (see `Cache`; `await handle.invalidate()` drops it).
        With `timeout_s`, each of its replies may take that many seconds instead of the
        sidecar's provider_timeout_s (up to its max_callback_timeout_s). With
        `failure_policy` FailurePolicy.IGNORE, an assembly it fails goes on as if it had
        called next() unchanged: only for a listener that decorates, never one that
        filters (docs/protocol.md, "Failure policy").
        """
        asked = _Asked(cache, timeout_s, failure_policy)
        start = pb.ListenStart(
            prepend=prepend,
            name=name or listener_name(listener),
            features=[FEATURE_TOOL_SLOTS, FEATURE_CALLBACK_CACHE, FEATURE_PART_SLOTS],
            timeout_s=asked.seconds(),
            failure_policy=asked.policy(),
        )
        if asked.cache is not None:
            start.cache.CopyFrom(asked.cache.to_proto())
        setattr(start, "global", global_)  # a Python keyword as a field name
        record = ListenerRegistration(
            start=start,
            listener=listener,
            stub=self._stub,
            on_lost=self._connection.listener_lost,
            on_ejected=self._connection.listener_ejected,
        )
        await self._make(record, None)
        return ListenerHandle(self._connection, record)

    async def rule(
        self, name: str, rule: Rule, *, prepend: bool = False, global_: bool = False
    ) -> Handle:
        """Register a rule: a waterfall step the sidecar runs itself, with no round trip
        (docs/protocol.md, "Rules"). It runs where a listener installed here would, in the
        same order (`prepend`, `global_` as for `on_assemble`). `await handle.update(rule)`
        replaces what it does in place; `await handle()` removes it. A rule that does not
        compile is refused with RULE_INVALID, naming the expression and CEL's message."""
        request = pb.RegisterRuleRequest(name=name, prepend=prepend, rule=rule_spec(rule))
        setattr(request, "global", global_)  # a Python keyword as a field name
        record = Contribution(request=request, rpc=self._stub.RegisterRule)
        return await self._register_value(record, None)

    def _source(self, value: object, field: str, labelled: str, asked: _Asked) -> str | pb.Dynamic:
        """A text or value as sent: the string itself, or its provider's key here
        (`labelled` names the provider in traces: `section provider "cwd"`)."""
        if callable(value):
            return self._dynamic(value, labelled, asked)
        asked.refuse_static()
        if not isinstance(value, str):
            raise invalid_value(f"{field} must be a str or a callable, not {type(value).__name__}")
        return value

    def _dynamic(self, provider: Any, labelled: str, asked: _Asked) -> pb.Dynamic:
        seconds, policy = asked.seconds(), asked.policy()  # refused before the provider is kept
        dynamic = pb.Dynamic(
            provider_key=self._connection.providers.add(provider, labelled),
            timeout_s=seconds,
            failure_policy=policy,
        )
        if asked.cache is not None:
            dynamic.cache.CopyFrom(asked.cache.to_proto())
        return dynamic

    async def _register(
        self, record: Registration, source: str | pb.Dynamic | None = None
    ) -> Disposer:
        await self._make(record, source)
        return Disposer(lambda: self._connection.dispose(record))

    async def _register_text(
        self,
        record: Contribution[Any],
        kind: str,
        text: TextSource,
        asked: _Asked,
    ) -> Handle:
        """A section or context: its text, or its provider (`section provider "cwd"`)."""
        labelled = f'{kind} provider "{record.request.name}"'
        source = _with_text(record.request, self._source(text, "text", labelled, asked))
        return await self._register_value(record, source)

    async def _register_value(
        self, record: Contribution[Any], source: str | pb.Dynamic | None
    ) -> Handle:
        await self._make(record, source)
        return Handle(self._connection, record)

    async def _make(self, record: Registration, source: str | pb.Dynamic | None) -> None:
        record.scope = self._scope
        if isinstance(source, pb.Dynamic):
            record.provider_key = source.provider_key
        await self._connection.register(record)


class _TextRequest(Protocol):
    """A section or context request: its text is a string or a provider's."""

    text: str

    @property
    def dynamic(self) -> pb.Dynamic: ...


def _with_text(request: _TextRequest, source: str | pb.Dynamic) -> str | pb.Dynamic:
    if isinstance(source, str):
        request.text = source
    else:
        request.dynamic.CopyFrom(source)
    return source


@dataclass(frozen=True)
class _Asked:
    """How a callback is asked, as its registration says: `cache=`, `timeout_s=` and
    `failure_policy=`."""

    cache: Cache | None
    timeout_s: float | None
    failure_policy: FailurePolicy | None = None

    def refuse_static(self) -> None:
        """They are for providers: a static value is never asked for."""
        given_options = (
            (self.cache, "cache="),
            (self.timeout_s, "timeout_s="),
            (self.failure_policy, "failure_policy="),
        )
        for given, option in given_options:
            if given is not None:
                raise invalid_value(
                    f"{option} applies to a provider (a callable), not to a static value"
                )

    def seconds(self) -> float:
        """The callback's own time as sent; 0 (the sidecar's provider_timeout_s) if none."""
        timeout_s = self.timeout_s
        if timeout_s is None:
            return 0.0
        number = isinstance(timeout_s, int | float) and not isinstance(timeout_s, bool)
        if not number or not math.isfinite(timeout_s) or timeout_s <= 0:
            raise invalid_value(
                f"timeout_s must be a positive number of seconds, not {timeout_s!r}"
            )
        return float(timeout_s)

    def policy(self) -> pb.FailurePolicy.ValueType:
        """The failure policy as sent; unspecified (FAIL, the sidecar's default) if none."""
        if self.failure_policy is None:
            return pb.FAILURE_POLICY_UNSPECIFIED
        return failure_policy_to_proto(self.failure_policy)


def _order(order: float) -> float:
    if isinstance(order, bool) or not isinstance(order, int | float):
        raise invalid_value(f"order must be a number, not {type(order).__name__}")
    return float(order)
