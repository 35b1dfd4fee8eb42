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
from collections.abc import Callable, Coroutine
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import FEATURE_CALLBACK_CACHE, FEATURE_EACH_ANSWER, package_version

from ._dispatch import Dispatch, Handler
from ._opening import TwoWayCall, confirmed
from ._providers import Providers, Waiting

_log = logging.getLogger("dsh_system_prompt")
_END_WAIT_S = 5.0  # how long ending waits for the sidecar to close its side

CLIENT_VERSION = f"dsh-system-prompt-python/{package_version()}"


_SessionCall = TwoWayCall[pb.OpenSessionRequest]  # the client's side of an OpenSession stream


_FRAMING_BYTES = 64  # the OpenSessionRequest around a ProvideResponse, with room to spare


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
        self.each_answer = False  # whether the sidecar confirmed `each-answer`
        # the largest message the sidecar reads (0: not said): an answer past it is sent as
        # its provider's error, since a message over it would end the whole session
        self.max_message_bytes = 0
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
            features=[FEATURE_CALLBACK_CACHE, FEATURE_EACH_ANSWER],
        )
        sent = call.write(pb.OpenSessionRequest(start=start))
        doing, named = "opening the session", ("session_id", "session id")
        first = await confirmed(call, sent, pb.OpenSessionResponse, "opened", doing, timeout, named)
        session = cls(call, first.opened.session_id, providers)
        session.sidecar_version = first.opened.sidecar_version  # for diagnostics only
        session.callback_cache = FEATURE_CALLBACK_CACHE in first.opened.features
        # each provider's answer goes as it comes: a slow one holds up (and blames) no other
        session.each_answer = FEATURE_EACH_ANSWER in first.opened.features
        session.max_message_bytes = first.opened.max_message_bytes
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
        if not waiting:  # every value is in: answered from the reader, with no task
            self._send_provided(response)
        elif self.each_answer:  # those in go now, each of the others once it is in
            ready = [value for value in response.values if value.WhichOneof("value")]
            if ready:
                self._send_provided(pb.ProvideResponse(call_id=request.call_id, values=ready))
            call_id = request.call_id
            self._stream.start(call_id, lambda: self._answer_each(call_id, waiting))
        else:  # started now; the task waits for them and answers
            pending = asyncio.gather(*(work for _, work in waiting))
            self._stream.start(request.call_id, lambda: self._answer(response, pending))

    def _cancel(self, cancel: pb.ProvideCancel) -> None:
        self._stream.cancel(cancel.call_id)

    async def _answer(
        self, response: pb.ProvideResponse, pending: asyncio.Future[list[None]]
    ) -> None:
        await pending
        self._send_provided(response)

    def _send_provided(self, response: pb.ProvideResponse) -> None:
        """Send `response`, its largest values replaced by their providers' errors while it
        is over what the sidecar reads (the assembly fails naming them; the session lives)."""
        limit = self.max_message_bytes - _FRAMING_BYTES
        if self.max_message_bytes and response.ByteSize() > limit:
            for value in sorted(response.values, key=lambda v: v.ByteSize(), reverse=True):
                size = value.ByteSize()
                message = f"its answer of {size} bytes is over the sidecar's max_message_bytes"
                value.error.CopyFrom(pb.ProviderError(message=message, answer_bytes=size))
                _log.warning("provider %r: %s", value.provider_key, message)
                if response.ByteSize() <= limit:
                    break
        self._stream.send(pb.OpenSessionRequest(provided=response))

    async def _answer_each(self, call_id: int, waiting: Waiting) -> None:
        async def one(value: pb.ProvidedValue, work: Coroutine[Any, Any, None]) -> None:
            await work
            self._send_provided(pb.ProvideResponse(call_id=call_id, values=[value]))

        await asyncio.gather(*(one(value, work) for value, work in waiting))
