"""What every stream the client opens does first: read the sidecar's confirmation, bounded."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import Message

from .errors import NoAnswer, error_from_rpc, protocol_error, stream_ended

Reply = TypeVar("Reply", bound=Message)
Request = TypeVar("Request", bound=Message, contravariant=True)


class OpeningCall(Protocol):
    """The parts of a streaming call that its opening uses."""

    async def read(self) -> object: ...  # the first response, or grpc.aio.EOF

    async def code(self) -> grpc.StatusCode: ...

    def cancel(self) -> bool: ...


class TwoWayCall(OpeningCall, Protocol[Request]):
    """The client's side of a stream it writes on too (a session, a listener): its reads
    are the responses, or grpc.aio.EOF at the end."""

    async def write(self, request: Request) -> None: ...

    async def done_writing(self) -> None: ...


async def confirmed(
    call: OpeningCall,
    sent: Awaitable[None] | None,
    reply: type[Reply],
    case: str,
    doing: str,
    timeout: float,
    named: tuple[str, str] | None = None,
) -> Reply:
    """The stream's first response, whose oneof must be `case`, within `timeout`.

    `sent` is the write of the start message, when the stream has one; `named` is the
    confirmation's field that names what was opened, and how errors say it. A silent
    sidecar raises NoAnswer, a refusal its own error, an early end SIDECAR_UNAVAILABLE
    and any other first message, or one without its name, PROTOCOL_ERROR; the call is
    cancelled on the way out whenever the sidecar may still hold it.
    """
    try:
        async with asyncio.timeout(timeout):
            if sent is not None:
                await sent
            first = await call.read()
    except TimeoutError:
        call.cancel()  # a silent sidecar keeps no stream of ours
        raise NoAnswer(doing, timeout) from None
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    if not isinstance(first, reply):  # grpc.aio.EOF: the sidecar ended the stream
        raise stream_ended(f"it ended the stream while {doing}", await call.code())
    kind = first.WhichOneof("kind")
    if kind != case:
        call.cancel()
        raise protocol_error(f"{doing}: the first message was {kind or 'empty'}, not {case}")
    if named is not None and not getattr(getattr(first, case), named[0]):
        call.cancel()
        raise protocol_error(f"{doing}: the sidecar sent no {named[1]}")
    return first
