"""Bearer-token authentication for every RPC and stream."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from dsh_system_prompt_core import Reason

from ..registry import ServiceError, Status
from .status import abort

# The platform's probes cannot send a token; health says nothing about the registry.
EXEMPT_SERVICES = ("/grpc.health.v1.Health/",)
_FIRST_MESSAGE_WAIT_S = 1.0
_MESSAGE = "missing or invalid bearer token (send 'authorization: Bearer <token>')"


def read_token(path: str) -> str:
    """The token in `path`, without surrounding whitespace; it must not be empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"auth token file {path} is empty")
    return token


# grpcio ships no typing, so its base classes are Any to mypy.
class BearerTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Rejects calls without `authorization: Bearer <token>` (UNAUTHENTICATED)."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode()

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(EXEMPT_SERVICES):
            return handler
        if self._authorized(handler_call_details.invocation_metadata or ()):
            return handler
        return _refusing(handler)

    def _authorized(self, metadata: Any) -> bool:
        for key, value in metadata:
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                scheme, _, token = given.partition(b" ")
                # RFC 6750 (via RFC 7235): the scheme is case-insensitive, the token is not.
                return scheme.lower() == b"bearer" and hmac.compare_digest(
                    token.strip(b" "), self._expected
                )
        return False


def _refusing(handler: Any) -> Any:
    """A handler of the same shape as `handler` that ends the call UNAUTHENTICATED."""

    async def refuse(request: Any, context: Any) -> None:
        if handler.request_streaming:
            # Refusing before the client's first message lands can reach the client as
            # INTERNAL instead of this status (grpc/grpc#36066): wait for it, briefly.
            with contextlib.suppress(TimeoutError, grpc.RpcError):
                await asyncio.wait_for(context.read(), _FIRST_MESSAGE_WAIT_S)
        await abort(context, ServiceError(Status.UNAUTHENTICATED, Reason.UNAUTHENTICATED, _MESSAGE))

    options = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **options)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **options)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **options)
    return grpc.unary_unary_rpc_method_handler(refuse, **options)
