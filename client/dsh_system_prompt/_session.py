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
from typing import Protocol

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_core import FEATURE_CALLBACK_CACHE, package_version

from ._callback_cache import Invalidations
from ._opening import confirmed
from ._providers import Providers
from .errors import protocol_error

_log = logging.getLogger("dsh_system_prompt")
_END_WAIT_S = 5.0  # how long ending waits for the sidecar to close its side

CLIENT_VERSION = f"dsh-system-prompt-python/{package_version()}"


class _SessionCall(Protocol):
    """The client's side of an OpenSession stream."""

    async def write(self, request: pb.OpenSessionRequest) -> None: ...

    async def read(self) -> object: ...  # an OpenSessionResponse, or grpc.aio.EOF at the end

    async def done_writing(self) -> None: ...

    async def code(self) -> grpc.StatusCode: ...

    def cancel(self) -> bool: ...


class Session:
    """One open session stream: its id, its reader, the provider answers running on it."""

    def __init__(self, call: _SessionCall, session_id: str, providers: Providers) -> None:
        self.id = session_id
        self._call = call
        self._providers = providers
        self._ending = False
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._answering: dict[int, asyncio.Task[None]] = {}
        self._invalidations = Invalidations()
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
        first = await confirmed(
            call, sent, pb.OpenSessionResponse, "opened", "opening the session", timeout
        )
        if not first.opened.session_id:
            call.cancel()
            raise protocol_error("opening the session: the sidecar sent no session id")
        session = cls(call, first.opened.session_id, providers)
        session.sidecar_version = first.opened.sidecar_version  # for diagnostics only
        session.callback_cache = FEATURE_CALLBACK_CACHE in first.opened.features
        _log.debug("session %s opened on %s", session.id, session.sidecar_version or "a sidecar")
        session._reader = asyncio.create_task(session._read(on_lost))
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
        self._cancel_answers()
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
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
            await self._invalidations.invalidate(self._write, timeout, provider_keys)

    async def _write(self, invalidate: pb.CacheInvalidate) -> None:
        async with self._write_lock:
            await self._call.write(pb.OpenSessionRequest(invalidate=invalidate))

    async def _read(self, on_lost: Callable[[Session], None]) -> None:
        try:
            while isinstance(message := await self._call.read(), pb.OpenSessionResponse):
                kind = message.WhichOneof("kind")
                if kind == "provide":
                    self._start_answer(message.provide)
                elif kind == "cancel":
                    task = self._answering.get(message.cancel.call_id)
                    if task is not None:
                        task.cancel()
                elif kind == "invalidated":
                    self._invalidations.confirmed(message.invalidated.invalidate_id)
                # A second `opened`, and a kind this client does not know (a newer
                # sidecar's), are ignored: the first `opened` named the session.
        except grpc.RpcError:
            pass
        finally:
            self._cancel_answers()  # nobody reads their answers any more
            self._invalidations.release()
            if not self._ending:
                on_lost(self)

    def _start_answer(self, request: pb.ProvideRequest) -> None:
        call_id = request.call_id
        if call_id in self._answering:
            return  # a repeated call id: the first request is being answered
        task = asyncio.create_task(self._answer(request))
        self._answering[call_id] = task
        task.add_done_callback(lambda _: self._answering.pop(call_id, None))

    async def _answer(self, request: pb.ProvideRequest) -> None:
        response = await self._providers.answer(request)
        async with self._write_lock:  # one outstanding write per stream
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await self._call.write(pb.OpenSessionRequest(provided=response))

    def _cancel_answers(self) -> None:
        for task in list(self._answering.values()):
            task.cancel()
