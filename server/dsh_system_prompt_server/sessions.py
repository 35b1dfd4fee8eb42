"""Sessions: the streams that own registrations and answer for dynamic providers."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from .convert import context_to_proto, toolset_from_proto
from .registry import (
    AssembleContext,
    Kind,
    ProvidedValue,
    ProviderCall,
    Registry,
    RegistryError,
    Status,
    new_id,
)
from .registry.limits import quota_exceeded
from .status import unknown_session

_KIND_TO_PROTO = {
    Kind.SECTION: pb.PROVIDER_KIND_SECTION,
    Kind.CONTEXT: pb.PROVIDER_KIND_CONTEXT,
    Kind.TOOLS: pb.PROVIDER_KIND_TOOLS,
    Kind.VARIABLE: pb.PROVIDER_KIND_VARIABLE,
}
_EXPECTED_CASES = {
    Kind.SECTION: ("text",),
    Kind.CONTEXT: ("text",),
    Kind.TOOLS: ("tools",),
    Kind.VARIABLE: ("variable_value", "no_value"),
}


class Session:
    """One client session; evaluates its dynamic providers over its stream."""

    def __init__(self, session_id: str, client_name: str) -> None:
        self.id = session_id
        self.client_name = client_name
        self.outbox: asyncio.Queue[pb.OpenSessionResponse] = asyncio.Queue()
        self.closed = False
        self.provide_requests = 0  # one per assembly that needed this session
        self._pending: dict[int, asyncio.Future[pb.ProvideResponse]] = {}
        self._call_ids = itertools.count(1)

    async def provide(
        self, calls: Sequence[ProviderCall], context: AssembleContext, timeout: float | None
    ) -> Mapping[str, ProvidedValue]:
        """Ask the client for every value in `calls` with one message."""
        if self.closed:
            raise _unavailable(calls)
        call_id = next(self._call_ids)
        self.provide_requests += 1
        answer: asyncio.Future[pb.ProvideResponse] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = answer
        self.outbox.put_nowait(
            pb.OpenSessionResponse(
                provide=pb.ProvideRequest(
                    call_id=call_id,
                    context=context_to_proto(context),
                    calls=[
                        pb.ProvideCall(provider_key=c.key, kind=_KIND_TO_PROTO[c.kind])
                        for c in calls
                    ],
                    timeout_s=timeout or 0.0,
                )
            )
        )
        try:
            async with asyncio.timeout(timeout):
                response = await answer
        except TimeoutError:
            self._cancel(call_id)
            raise RegistryError(
                Status.DEADLINE_EXCEEDED,
                "PROVIDER_TIMEOUT",
                f"{_describe(calls)} did not answer within {timeout:g}s",
            ) from None
        except _SessionGone:
            raise _unavailable(calls) from None
        except asyncio.CancelledError:
            self._cancel(call_id)
            raise
        finally:
            self._pending.pop(call_id, None)
        return _decode(calls, response)

    def deliver(self, response: pb.ProvideResponse) -> None:
        """Hand an answer from the stream to the assembly waiting for it."""
        waiting = self._pending.get(response.call_id)
        if waiting is not None and not waiting.done():
            waiting.set_result(response)

    def close(self) -> None:
        """The stream ended: every waiting assembly fails UNAVAILABLE."""
        self.closed = True
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(_SessionGone())
        self._pending.clear()

    def _cancel(self, call_id: int) -> None:
        if not self.closed:
            self.outbox.put_nowait(pb.OpenSessionResponse(cancel=pb.ProvideCancel(call_id=call_id)))


class _SessionGone(Exception):
    pass


class Sessions:
    """The open sessions; closing one disposes everything it registered."""

    def __init__(self, registry: Registry, max_sessions: int = 1_000) -> None:
        self._registry = registry
        self._max_sessions = max_sessions
        self._open: dict[str, Session] = {}

    def open(self, client_name: str) -> Session:
        if len(self._open) >= self._max_sessions:
            raise quota_exceeded(f"the sidecar already has {len(self._open)} sessions, its limit")
        session = Session(new_id(), client_name)
        self._open[session.id] = session
        return session

    def get(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is None:
            raise unknown_session()
        return session

    def close(self, session: Session) -> None:
        if self._open.pop(session.id, None) is None:
            return
        session.close()
        self._registry.dispose_owner(session.id)

    def __len__(self) -> int:
        return len(self._open)


def _decode(
    calls: Sequence[ProviderCall], response: pb.ProvideResponse
) -> dict[str, ProvidedValue]:
    answers = {value.provider_key: value for value in response.values}
    values: dict[str, ProvidedValue] = {}
    for call in calls:
        answer = answers.get(call.key)
        if answer is None:
            raise _failed(call, "it gave no answer")
        case = answer.WhichOneof("value")
        if case == "error":
            raise _failed(call, answer.error.message)
        if case not in _EXPECTED_CASES[call.kind]:
            raise _failed(call, f"it answered {case or 'nothing'} instead of {call.kind.value}")
        values[call.key] = _value(call, answer)
    return values


def _value(call: ProviderCall, answer: pb.ProvidedValue) -> ProvidedValue:
    if call.kind is Kind.TOOLS:
        try:
            return toolset_from_proto(answer.tools)
        except RegistryError as error:
            raise _failed(call, error.message) from None
    if answer.HasField("no_value"):
        return None
    return answer.text if call.kind in (Kind.SECTION, Kind.CONTEXT) else answer.variable_value


def _failed(call: ProviderCall, message: str) -> RegistryError:
    return RegistryError(Status.ABORTED, "PROVIDER_FAILED", f"{call.describe()} failed: {message}")


def _describe(calls: Sequence[ProviderCall]) -> str:
    return ", ".join(call.describe() for call in calls)


def _unavailable(calls: Sequence[ProviderCall]) -> RegistryError:
    return RegistryError(
        Status.UNAVAILABLE,
        "PROVIDER_UNAVAILABLE",
        f"{_describe(calls)} unavailable: the session that registered it has ended",
    )
