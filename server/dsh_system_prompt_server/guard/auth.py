"""Authentication and authorization of every RPC and stream.

A call presents a credential by `authorization: Bearer <token>`, or, under
mutual TLS, by its client certificate (its CN or a SAN names the credential);
without one it is UNAUTHENTICATED. Two interceptions: `identifying`, outermost, only
finds the credential, so that the call waits for and is charged to its client's fair
share (`shares`) from its start; `around`, inside the share, refuses a call without one
(charged to the share of calls without a credential, `shares.ANONYMOUS`, before its body
is parsed: a refusal costs less than the call it imitates). Then the policy
(`policy.decide`) says whether that credential may make the request; if not,
PERMISSION_DENIED with reason PERMISSION_DENIED and what it lacks. A stream is decided
on its first message, and again whenever the credentials change (`revocation.py`): one
no longer allowed ends. A session is bound to the credential that opened it: calls naming
it with another credential are refused, so a leaked session id is not a way around; and
its listeners, rules and dynamic providers run only for assemblies of the scopes
the credential may read (`policy.reach_of`, registry/reach.py).
The admitted credential's name is the call's `clients.CALLER`: quotas count per
credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason

from ..registry import Registry, ServiceError, Status
from ..wire import (
    RAW_REQUESTS,
    Behaviour,
    Context,
    ContextAround,
    Method,
    request_of,
)
from .access import describe, session_of
from .clients import CALLER, STEP_NAMES, VALUES
from .policy import Credential, decide, may_see_values, reach_of, step_names
from .revocation import OpenStream, OpenStreams

# The platform's probes cannot send a token; health says nothing about the registry.
EXEMPT_SERVICES = ("/grpc.health.v1.Health/",)
_FIRST_MESSAGE_WAIT_S = 1.0
_MESSAGE = "missing or invalid bearer token (send 'authorization: Bearer <token>')"
# Where grpc puts a verified client certificate's names (grpc's auth context keys).
_CERTIFICATE_NAMES = ("x509_common_name", "x509_subject_alternative_name")


def _unauthenticated() -> ServiceError:
    """A refusal for want of a credential: every one the same, so its status is built once
    (wire/status.py)."""
    return ServiceError(Status.UNAUTHENTICATED, Reason.UNAUTHENTICATED, _MESSAGE)


# The credential the call being served presented (None: none, or a wrong one), found by
# `identifying`; each gRPC call runs in a context of its own, so one never sees another's.
_PRESENTED: ContextVar[Credential | None] = ContextVar("presented", default=None)


def read_token(path: str) -> str:
    """The token in `path`, without surrounding whitespace; it must not be empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"auth token file {path} is empty")
    return token


class Authenticator:
    """Which credential a call presents; `update` takes a reloaded set."""

    def __init__(self, credentials: Sequence[Credential]) -> None:
        self._tokens: list[tuple[bytes, Credential]] = []
        self._certificates: dict[str, Credential] = {}
        self.updated: list[Callable[[], object]] = []  # called after each update
        self.update(credentials)

    def update(self, credentials: Sequence[Credential]) -> None:
        """Use `credentials` from now on (their token files read now)."""
        self._tokens = [(read_token(c.token_file).encode(), c) for c in credentials if c.token_file]
        self._certificates = {c.client_certificate: c for c in credentials if c.client_certificate}
        for then in self.updated:
            then()

    def token_of(self, name: str) -> tuple[bytes, Credential] | None:
        """The token and credential named `name`, when it has a token."""
        return next(((t, c) for t, c in self._tokens if c.name == name), None)

    def by_token(self, token: bytes) -> Credential | None:
        """The credential of `token`, compared in constant time with every known one."""
        found = None
        for known, credential in self._tokens:
            if hmac.compare_digest(token, known):
                found = credential
        return found

    def identify(
        self, metadata: Iterable[tuple[str, Any]], peer: dict[Any, Any]
    ) -> Credential | None:
        """A bearer token's credential (a wrong token is None, whatever the certificate);
        else the credential one of the client certificate's names is bound to."""
        for key, value in metadata:
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                scheme, _, token = given.partition(b" ")
                # RFC 6750 (via RFC 7235): the scheme is case-insensitive, the token is not.
                if scheme.lower() != b"bearer":
                    return None
                return self.by_token(token.strip(b" "))
        for key in _CERTIFICATE_NAMES:
            for name in peer.get(key) or ():
                text = name.decode() if isinstance(name, bytes) else str(name)
                if text in self._certificates:
                    return self._certificates[text]
        return None


class AuthInterceptor:
    """Every call but health's: its credential, then the policy on its request."""

    def __init__(self, authenticator: Authenticator, registry: Registry) -> None:
        self._authenticator = authenticator
        self._registry = registry
        self._session_owners: dict[str, str] = {}  # session id -> its credential's name
        # a call refused, by its reason (UNAUTHENTICATED, PERMISSION_DENIED): the metrics
        self.on_refused: Callable[[str], None] = lambda reason: None
        self.streams = OpenStreams()  # decided again at each change of the credentials
        authenticator.updated.append(self.revise)

    def revise(self) -> int:
        """Decide every open stream again with the credentials as they are now."""
        return self.streams.revise(self._authenticator.identify, self._registry, self.opened)

    def identifying(self, method: Method, behaviour: Behaviour) -> Behaviour:
        """The `identity` interception, inside tracing and the status: every call's credential
        found (health's and reflection's too) and made its CALLER, before its client's share
        is asked for; a call without one goes on to be refused by `around`."""

        async def identified(request: Any, context: Context) -> Any:
            credential = self.credential(context)
            if credential is not None:
                CALLER.set(credential.name)  # the call's own context: nothing to reset
                VALUES.set(functools.partial(may_see_values, credential))
                STEP_NAMES.set(step_names(credential))
                _PRESENTED.set(credential)
            return await behaviour(request, context)

        return identified

    def around(self, method: Method, behaviour: Behaviour) -> Behaviour:
        """The `auth` interception: `behaviour` run once the call's credential is known and
        the policy lets it send its request (a stream: its first message)."""
        if method.path.startswith(EXEMPT_SERVICES):
            return behaviour
        call = _Call(self, method.name if method.ours else "")
        if method.client_streaming:
            return _streamed(call, behaviour)
        return _unary(call, behaviour, method.server_streaming)

    def credential(self, context: Any) -> Credential | None:
        metadata = context.invocation_metadata() or ()
        return self._authenticator.identify(metadata, context.auth_context() or {})

    def read(self, method: str, message: Any) -> Any:
        """`message` as the policy reads it: a call's bytes (wire.handlers) parsed; None for
        bytes the service will refuse."""
        if isinstance(message, bytes):
            return request_of(method, message, self._registry.limits)
        return message

    def denial(
        self, method: str, message: Any, credential: Credential, stream: OpenStream | None = None
    ) -> ServiceError | None:
        """Why `credential` may not send `message` to `method`, or None; a message the
        service will refuse is left to it. A `stream`'s request is kept, to decide again."""
        message = self.read(method, message)
        if message is None:
            return None
        session = session_of(method, message)
        owner = self._session_owners.get(session) if session else None
        if owner is not None and owner != credential.name:
            return _denied(
                f"{credential.describe()} may not use a session opened by credential"
                f' "{owner}": open its own'
            )
        request = describe(method, message, self._registry) if method else None
        if stream is not None:
            stream.request = request
        verdict = None if request is None else decide(credential, request)
        return None if verdict is None else _denied(verdict.message)

    def opened(self, session_id: str, credential: Credential) -> None:
        """`session_id` was opened by `credential`: only it may use the session, and the
        session's steps and providers run only where the credential may read."""
        self._session_owners[session_id] = credential.name
        self._registry.bind_reach(session_id, reach_of(credential))

    def closed(self, session_id: str) -> None:
        self._session_owners.pop(session_id, None)


class _Call:
    """One method's checks, shared by every call of it."""

    def __init__(self, interceptor: AuthInterceptor, method: str) -> None:
        self.interceptor = interceptor
        self.method = method

    async def admitted(self, context: Any, streaming: bool) -> Credential:
        """The call's credential (`identifying` found it); UNAUTHENTICATED without one,
        before anything the call sent is parsed."""
        credential = _PRESENTED.get()
        if credential is not None:
            return credential
        self.interceptor.on_refused(Reason.UNAUTHENTICATED)
        if streaming:
            # Refusing before the client's first message lands can reach the client as
            # INTERNAL instead of this status (grpc/grpc#36066): wait for it, briefly.
            with contextlib.suppress(TimeoutError, grpc.RpcError):
                await asyncio.wait_for(context.read(), _FIRST_MESSAGE_WAIT_S)
        raise _unauthenticated()  # its status: handlers.ending

    async def check(
        self, context: Any, message: Any, credential: Credential, stream: OpenStream | None = None
    ) -> None:
        denial = self.interceptor.denial(self.method, message, credential, stream)
        if denial is not None:
            self.interceptor.on_refused(denial.reason)
            raise denial  # its status: handlers.ending

    def opened(self, context: Any, credential: Credential) -> OpenStream:
        """A stream admitted with `credential`, to decide again while it is open."""
        metadata = context.invocation_metadata() or ()
        stream = OpenStream(self.method, metadata, context.auth_context() or {})
        stream.credential = credential
        return stream

    async def run(self, context: Any, stream: OpenStream, running: Any) -> Any:
        """Await `running` while the stream is open; ended by a revision, its status."""
        try:
            return await self.interceptor.streams.run(stream, running)
        except ServiceError as error:
            if error is not stream.ending:
                raise
            self.interceptor.on_refused(error.reason)  # counted as a refusal, by its reason
            raise  # its status: handlers.ending


def _denied(message: str) -> ServiceError:
    return ServiceError(Status.PERMISSION_DENIED, Reason.PERMISSION_DENIED, message)


def _streamed(call: _Call, behaviour: Behaviour) -> Behaviour:
    """A client-streaming `behaviour`, its first message checked as it is read."""

    async def streamed(requests: Any, context: Any) -> Any:
        credential = await call.admitted(context, streaming=True)
        stream = call.opened(context, credential)
        checked = _CheckedStream(context, call, stream)
        try:
            return await call.run(context, stream, behaviour(checked.requests(requests), checked))
        finally:
            checked.ended()

    return streamed


def _unary(call: _Call, behaviour: Behaviour, streams: bool) -> Behaviour:
    """A unary-request `behaviour`, its request checked before it runs; a response stream
    (a watch, a listing) decided again while it is open."""

    async def unary(request: Any, context: Any) -> Any:
        credential = await call.admitted(context, streaming=False)
        message = call.interceptor.read(call.method, request)
        stream = call.opened(context, credential) if streams else None
        await call.check(context, message, credential, stream)
        if stream is not None:  # a watch's or listing's step names and sizes follow a reload
            STEP_NAMES.set(stream.names_steps)
            VALUES.set(stream.sees_values)
        # parsed once: the servicer takes the policy's message, but Assemble its bytes
        handed = request if message is None or call.method in RAW_REQUESTS else message
        if stream is None:
            return await behaviour(handed, context)
        return await call.run(context, stream, behaviour(handed, context))

    return unary


class _CheckedStream(ContextAround):
    """A stream's context whose first message read is checked before the service sees it,
    and whose SessionOpened binds the session to the credential."""

    def __init__(self, context: Any, call: _Call, stream: OpenStream) -> None:
        super().__init__(context)
        self._call = call
        self._stream = stream  # its credential: the one a revision found last
        self._first = True
        self._session = ""

    async def read(self) -> Any:
        message = await self._context.read()
        await self._checked(message)
        return message

    async def requests(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in requests:
            await self._checked(message)
            yield message

    async def write(self, message: Any) -> None:
        opened = isinstance(message, pb.OpenSessionResponse) and message.HasField("opened")
        if opened and not self._session:
            self._session = self._stream.session = message.opened.session_id
            self._call.interceptor.opened(self._session, self._credential)
        await self._context.write(message)

    async def _checked(self, message: Any) -> None:
        if self._first and message is not grpc.aio.EOF:
            self._first = False
            await self._call.check(self._context, message, self._credential, self._stream)

    @property
    def _credential(self) -> Credential:
        assert self._stream.credential is not None  # admitted
        return self._stream.credential

    def ended(self) -> None:
        if self._session:
            self._call.interceptor.closed(self._session)
