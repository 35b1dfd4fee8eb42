"""The session stream's life cycle: open it, read it until it ends, end it.

A session is one `OpenSession` stream; everything registered on it lives as
long as the stream does. While open, the sidecar asks on it for provider values
(answered by `_providers`). When it ends without this client ending it, the
connection is told, and reconnects and replays (`_connection`, `_replay`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import FEATURE_CALLBACK_CACHE, package_version

from ._dispatch import Dispatch, Handler
from ._opening import TwoWayCall, confirmed
from ._providers import Providers

_log = logging.getLogger("dsh_system_prompt")
_END_WAIT_S = 5.0  # how long ending waits for the sidecar to close its side

CLIENT_VERSION = f"dsh-system-prompt-python/{package_version()}"


_SessionCall = TwoWayCall[pb.OpenSessionRequest]  # the client's side of an OpenSession stream


class Session:
    """One open session stream: its id, its reader, the provider answers running on it."""

    def __init__(self, call: _SessionCall, session_id: str, providers: Providers) -> None:
        self.id = session_id
        self._call = call
        self._providers = providers
        self._ending = False
        self._reader: asyncio.Task[None] | None = None
        handlers: dict[str, Handler] = {
            "provide": self._provide,
            "cancel": self._cancel,
            "ejected": lambda ejected: self.on_ejected(ejected),
        }
        # one of its providers was ejected (did not answer in time): the connection's
        self.on_ejected: Callable[[pb.CallbackEjected], None] = lambda _: None
        self._stream = Dispatch(pb.OpenSessionResponse, handlers, call)
        self.sidecar_version = ""
        self.callback_cache = False  # whether the sidecar confirmed `callback-cache`

    @classmethod
    async def open(
        cls,
        stub: pb_grpc.SystemPromptServiceStub,
        client_name: str,
        providers: Providers,
        on_lost: Callable[[Session], None],
        timeout: float,
    ) -> Session:
        """Open a session, confirmed within `timeout`; `on_lost` hears when it ends
        without `end()`."""
        call: _SessionCall = stub.OpenSession()
        start = pb.SessionStart(
            client_name=client_name,
            client_version=CLIENT_VERSION,
            features=[FEATURE_CALLBACK_CACHE],
        )
        sent = call.write(pb.OpenSessionRequest(start=start))
        doing, named = "opening the session", ("session_id", "session id")
        first = await confirmed(call, sent, pb.OpenSessionResponse, "opened", doing, timeout, named)
        session = cls(call, first.opened.session_id, providers)
        session.sidecar_version = first.opened.sidecar_version  # for diagnostics only
        session.callback_cache = FEATURE_CALLBACK_CACHE in first.opened.features
        # %r: both are the sidecar's words; a log line carries none of their controls raw
        _log.debug("session %r opened on %r", session.id, session.sidecar_version or "a sidecar")
        session._reader = asyncio.create_task(session._stream.read(lambda: session._ended(on_lost)))
        return session

    @property
    def ended(self) -> bool:
        """The stream is over, whoever ended it."""
        return self._reader is not None and self._reader.done()

    async def end(self) -> None:
        """End the stream: the sidecar disposes everything registered on it."""
        if self._ending:
            return
        self._ending = True
        self._stream.cancel_all()
        # A half-close can fail in gRPC core's own terms (ExecuteBatchError, seen after a
        # fork under load); the call is cancelled below whatever happens, so ending never fails.
        with contextlib.suppress(Exception):
            await self._call.done_writing()
        if self._reader is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), _END_WAIT_S)
            self._reader.cancel()
        self._call.cancel()  # a sidecar that never closed its side keeps no stream of ours

    async def invalidate(self, provider_keys: list[str], timeout: float) -> None:
        """Drop the sidecar's cached answers of these providers; done once it confirms
        (within `timeout`). A sidecar without the feature caches nothing to drop."""
        if self.callback_cache and not self.ended and not self._ending:
            await self._stream.invalidations.invalidate(self._write, timeout, provider_keys)

    async def _write(self, invalidate: pb.CacheInvalidate) -> None:
        await self._stream.write(pb.OpenSessionRequest(invalidate=invalidate))

    def _ended(self, on_lost: Callable[[Session], None]) -> None:
        if not self._ending:
            on_lost(self)

    def _provide(self, request: pb.ProvideRequest) -> None:
        if self._stream.answering(request.call_id):
            return  # a repeat of a call being answered
        response, waiting = self._providers.begin(request)
        if waiting:  # started now; the task waits for them and answers
            pending = asyncio.gather(*waiting)
            self._stream.start(request.call_id, lambda: self._answer(response, pending))
        else:  # every value is in: answered from the reader, with no task
            self._stream.send(pb.OpenSessionRequest(provided=response))

    def _cancel(self, cancel: pb.ProvideCancel) -> None:
        self._stream.cancel(cancel.call_id)

    async def _answer(
        self, response: pb.ProvideResponse, pending: asyncio.Future[list[None]]
    ) -> None:
        await pending
        self._stream.send(pb.OpenSessionRequest(provided=response))
