"""Revocation is immediate: the open streams, re-decided whenever the credentials change.

A stream (a session, a listener, a watch of changes or of a prompt, a listing) is
admitted on its first message, but it lives on: a config reload that removes a
credential, rotates its token, or narrows what it may read must reach it too, or a
revoked peer keeps its rights for as long as it keeps its connection. Modelled on
Envoy's listener updates, which drain the open connections a new filter chain no longer
admits rather than letting them run to their end (Kubernetes' API server, by contrast,
authorizes a watch once, at its start, and lets it run until its timeout: the
behaviour this replaces).

At every change of the credentials each open stream is decided again, as if it opened
now: the credential its call presented (the same token or certificate names) is looked
up in the new set, UNAUTHENTICATED when none is left; the request its first message made
is decided against that credential's new grants, PERMISSION_DENIED when it may no
longer. A stream so ended is cancelled where it runs, so what it opened is closed as a
dead peer's would be (a session's registrations disposed, with their change events),
then it ends with that status. A session that may go on keeps only the registrations its
credential may still make: each is decided again as its registration, and disposed when
refused. Listeners are their own streams and are decided as such. A watch or listing that
goes on is shown step names, and a listing variables' sizes, by its credential as it is now
(`OpenStream.names_steps`, `OpenStream.sees_values`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from dsh_system_prompt_core import Reason

from ..registry import Kind, Registry, ServiceError, Status
from ..telemetry import logger
from .policy import Credential, Request, Verb, decide, may_see_values, step_names

Identify = Callable[[Iterable[tuple[str, Any]], dict[Any, Any]], Credential | None]
REVOKED = (
    "credential revoked: the token or client certificate this stream was opened with is"
    " no longer valid after a config reload"
)
_log = logger("auth")
# What a registration is, as the policy's Request names what is registered.
_REGISTERED = {
    Kind.SECTION: "section",
    Kind.CONTEXT: "context",
    Kind.TOOLS: "tools",
    Kind.VARIABLE: "variable",
    Kind.SUPPRESSOR: "suppressor",
}


class OpenStream:
    """One stream as the policy admitted it: what its call presented, what it asked for,
    and the task it runs in (to end it)."""

    def __init__(
        self, method: str, metadata: Iterable[tuple[str, Any]], peer: dict[Any, Any]
    ) -> None:
        self.method = method
        self.metadata = tuple(metadata)
        self.peer = dict(peer)
        self.credential: Credential | None = None  # once admitted
        self.request: Request | None = None  # once its first message is decided
        self.session = ""  # the session it opened (OpenSession)
        self.ending: ServiceError | None = None  # why it is being ended, once it is
        self._task = asyncio.current_task()

    def names_steps(self, scope: str | None) -> bool:
        """Whether the stream is shown the steps held in `scope` by name, by its credential as
        the last reload left it: a narrowed credential's open watch is shown less at once."""
        if self.credential is None:
            return False
        names = step_names(self.credential)
        return names is None or names(scope)

    def sees_values(self) -> bool:
        """Whether the stream is shown registered values and their exact sizes, by its
        credential as the last reload left it: a reader that lost `values` is shown less at once."""
        return self.credential is not None and may_see_values(self.credential)

    def end(self, error: ServiceError) -> None:
        """End the stream with `error`: its task is cancelled where it waits."""
        if self.ending is None and self._task is not None:
            self.ending = error
            self._task.cancel()


class OpenStreams:
    """The streams the policy admitted and that are still open."""

    def __init__(self) -> None:
        self._open: set[OpenStream] = set()

    def __len__(self) -> int:
        return len(self._open)

    async def run(self, stream: OpenStream, running: Any) -> Any:
        """Await `running` (the stream's behaviour) while `stream` is open; ended by a
        revision, the ServiceError it was ended with is raised (after what the behaviour
        does on cancellation: a session's registrations disposed)."""
        self._open.add(stream)
        try:
            return await running
        except asyncio.CancelledError:
            if stream.ending is None:
                raise  # the peer went away, or the sidecar stops
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            self._open.discard(stream)
        assert stream.ending is not None
        raise stream.ending

    def revise(
        self, identify: Identify, registry: Registry, kept: Callable[[str, Credential], None]
    ) -> int:
        """Decide every open stream again with the credentials `identify` knows now; end
        those no longer allowed, dispose of a surviving session's registrations its
        credential may no longer make, and tell `kept` of each session that goes on (with
        its credential as it is now: its steps' reach). How many streams were ended."""
        ended = 0
        for stream in list(self._open):
            error = _refusal(stream, identify(stream.metadata, stream.peer))
            if error is not None:
                _log.warning("ended a %s stream after a config reload: %s", stream.method, error)
                stream.end(error)
                ended += 1
            elif stream.session and stream.credential is not None:
                _narrow(registry, stream.session, stream.credential)
                kept(stream.session, stream.credential)
        return ended


def _refusal(stream: OpenStream, credential: Credential | None) -> ServiceError | None:
    """Why `stream` may not go on with `credential` (its call's, looked up now)."""
    if credential is None:
        return ServiceError(Status.UNAUTHENTICATED, Reason.UNAUTHENTICATED, REVOKED)
    stream.credential = credential  # its later messages are decided with the new grants
    verdict = None if stream.request is None else decide(credential, stream.request)
    if verdict is None:
        return None
    return ServiceError(
        Status.PERMISSION_DENIED,
        Reason.PERMISSION_DENIED,
        f"{verdict.message} (since a config reload)",
    )


def _narrow(registry: Registry, session: str, credential: Credential) -> None:
    """Dispose of `session`'s registrations that `credential` may no longer make, each
    decided as it was when made (its scope handles as OpenScope, with the parent key they
    named; its rules as RegisterRule);
    a handle's disposal takes what was registered through it."""
    for entry in registry.registrations(session):
        if entry.disposed:
            continue  # went with its scope handle
        request = _as_made(entry)
        if request is not None and decide(credential, request) is not None:
            registry.dispose(session, entry.id)


def _as_made(entry: Any) -> Request | None:
    """The request that made `entry`, as the policy saw it; None for a listener (its stream
    is decided as itself)."""
    if entry.kind is Kind.SCOPE:
        return Request(verb=Verb.OPEN_SCOPE, scope=entry.name, parent=entry.parent)
    if entry.kind is Kind.RULE:
        everywhere = entry.scope is None or entry.global_
        return Request(verb=Verb.RULE, scope=entry.scope, everywhere=everywhere, name=entry.name)
    kind = _REGISTERED.get(entry.kind)
    if kind is None:
        return None
    return Request(
        verb=Verb.REGISTER,
        scope=entry.scope,
        kind=kind,
        name=entry.name,
        complete=getattr(entry, "complete", False),
    )
