"""Each RPC's request as the policy sees it: what it reads or writes, in which scope.

A registration names its layer by a scope handle; the handle's key is looked up
in the registry. A handle the session does not hold is left to the service
(SCOPE_NOT_FOUND): `describe` answers None for it, and nothing is decided.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ..registry import Registry
from .policy import Request, Verb

_UNKNOWN = object()  # a handle the session does not hold


def describe(method: str, message: Any, registry: Registry) -> Request | None:
    """The policy's view of `message`, the request (or first stream message) of `method`
    (its short name: `RegisterSection`); None when the service must refuse it first."""
    build = _DESCRIBERS.get(method)
    if build is None:
        return None  # a method this sidecar does not know: gRPC answers UNIMPLEMENTED
    return build(message, _Handles(registry))


class _Handles:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def key(self, session_id: str, scope_id: str) -> object:
        """The key of the session's scope handle; None: the global layer."""
        if not scope_id:
            return None
        key = self._registry.handle_key(session_id, scope_id)
        return _UNKNOWN if key is None else key


def _registration(kind: str) -> Callable[[Any, _Handles], Request | None]:
    def build(message: Any, handles: _Handles) -> Request | None:
        scope = handles.key(message.session_id, message.scope_id)
        if scope is _UNKNOWN:
            return None
        assert scope is None or isinstance(scope, str)
        return Request(
            verb=Verb.REGISTER,
            scope=scope,
            kind=kind,
            name=getattr(message, "name", ""),
            complete=getattr(message, "complete", False),
        )

    return build


def _listen(message: pb.ListenRequest, handles: _Handles) -> Request | None:
    start = message.start
    scope = handles.key(start.session_id, start.scope_id)
    if scope is _UNKNOWN or not message.HasField("start"):
        return None  # the service refuses it (SCOPE_NOT_FOUND, BAD_STREAM)
    assert scope is None or isinstance(scope, str)
    return Request(
        verb=Verb.LISTEN, scope=scope, everywhere=scope is None or getattr(start, "global")
    )


def _rule(message: pb.RegisterRuleRequest, handles: _Handles) -> Request | None:
    scope = handles.key(message.session_id, message.scope_id)
    if scope is _UNKNOWN:
        return None  # the service refuses it (SCOPE_NOT_FOUND)
    assert scope is None or isinstance(scope, str)
    everywhere = scope is None or getattr(message, "global")  # a Python keyword
    return Request(verb=Verb.RULE, scope=scope, everywhere=everywhere, name=message.name)


def _open_scope(message: pb.OpenScopeRequest, handles: _Handles) -> Request:
    return Request(verb=Verb.OPEN_SCOPE, scope=message.key, parent=message.parent_key or None)


def _assemble(message: pb.AssembleRequest, handles: _Handles) -> Request:
    scope = message.context.scope or None
    if message.report:  # a report is kept in the cache history: a write
        return Request(verb=Verb.REPORT, scope=scope, report_key=message.report_key)
    return Request(verb=Verb.ASSEMBLE, scope=scope, values=True)


def _history(verb: Verb) -> Callable[[Any, _Handles], Request]:
    def build(message: Any, handles: _Handles) -> Request:
        return Request(verb=verb, scope=message.scope or None, report_key=message.report_key)

    return build


def _filtered(verb: Verb) -> Callable[[Any, _Handles], Request]:
    def build(message: Any, handles: _Handles) -> Request:
        scope = message.filter.scope or None
        values = bool(getattr(message, "include_values", False))
        return Request(verb=verb, scope=scope, every_scope=scope is None, values=values)

    return build


def _fixed(verb: Verb) -> Callable[[Any, _Handles], Request]:
    def build(message: Any, handles: _Handles) -> Request:
        return Request(verb=verb)

    return build


def _watch_prompt(message: pb.WatchPromptRequest, handles: _Handles) -> Request:
    return Request(verb=Verb.WATCH_PROMPT, scope=message.scope or None, values=True)


_DESCRIBERS: dict[str, Callable[[Any, _Handles], Request | None]] = {
    "OpenSession": _fixed(Verb.OPEN_SESSION),
    "RegisterSection": _registration("section"),
    "RegisterContext": _registration("context"),
    "SuppressRuntimeContext": _registration("suppressor"),
    "RegisterTools": _registration("tools"),
    "RegisterVariable": _registration("variable"),
    "RegisterRule": _rule,
    "OpenScope": _open_scope,
    "Dispose": _fixed(Verb.CHANGE_OWN),
    "Update": _fixed(Verb.CHANGE_OWN),
    "Assemble": _assemble,
    "WatchChanges": _filtered(Verb.WATCH_CHANGES),
    "ListRegistrations": _filtered(Verb.LIST),
    "WatchPrompt": _watch_prompt,
    "Listen": _listen,
    "ReportUsage": _history(Verb.REPORT),
    "GetCacheHistory": _history(Verb.READ_HISTORY),
}
SESSION_BOUND = frozenset(
    {
        "RegisterSection",
        "RegisterContext",
        "SuppressRuntimeContext",
        "RegisterTools",
        "RegisterVariable",
        "RegisterRule",
        "OpenScope",
        "Dispose",
        "Update",
    }
)
"""Methods whose request names a session (`session_id`): only its credential may use it."""


def session_of(method: str, message: Any) -> str:
    """The session a request acts for, or "" when it names none."""
    if method in SESSION_BOUND:
        return str(message.session_id)
    if method == "Listen" and message.HasField("start"):
        return str(message.start.session_id)
    return ""
