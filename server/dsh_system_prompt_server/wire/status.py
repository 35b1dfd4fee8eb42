"""A Failure -> gRPC status with a google.rpc.ErrorInfo detail; the service's own failures.

Every status carries its reason twice: in the ErrorInfo detail and in the
`dsh-error-reason` trailer, for clients that do not decode details.
"""

from __future__ import annotations

import functools
from typing import Any, NoReturn

import grpc
import grpc.aio
from dsh_system_prompt_core import Reason
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ..registry import Failure, ServiceError, Status

ERROR_DOMAIN = "dsh.systemprompt.v1"
REASON_TRAILER = "dsh-error-reason"
MAX_MESSAGE_BYTES = 1024
"""A status message travels twice in trailers (grpc-message, percent-encoded, and the
details, base64): longer ones would overflow the peer's 8 KiB metadata limit."""


def to_grpc_status(error: Failure) -> grpc.Status:
    """The status a client sees: code, the registry's message, ErrorInfo reason."""
    return _status(error.status, error.reason, error.message)


# Built once for the same failure: a flood's refusals are all one (18 µs each to build).
@functools.lru_cache(maxsize=256)
def _status(code: Status, reason: str, message: str) -> grpc.Status:
    info = error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(
        code=code_pb2.Code.Value(code.value), message=fitted(message), details=[detail]
    )
    return _WithReason(rpc_status.to_status(status), reason)


def fitted(message: str) -> str:
    """`message` cut to MAX_MESSAGE_BYTES of UTF-8; its start carries the spec's wording."""
    encoded = message.encode()
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return message
    suffix = f"… ({len(encoded)} bytes, cut)"
    head = encoded[: MAX_MESSAGE_BYTES - len(suffix.encode())]
    return head.decode(errors="ignore") + suffix


# grpcio ships no typing, so its base classes are Any to mypy.
class _WithReason(grpc.Status):  # type: ignore[misc]
    """A status that also carries the reason as a plain trailer, for clients in any language."""

    def __init__(self, status: Any, reason: str) -> None:
        self.code = status.code
        self.details = status.details
        self.trailing_metadata = (*status.trailing_metadata, (REASON_TRAILER, reason))


async def abort(context: grpc.aio.ServicerContext[object, object], error: Failure) -> NoReturn:
    """End the call with `error`'s status, raised (a stream's)."""
    # the frames `error` passed (a waterfall's) would wait for the collector on the abort's cycle
    error.__traceback__ = None
    await context.abort_with_status(to_grpc_status(error))
    raise AssertionError("abort_with_status returned")  # pragma: no cover


def set_status(context: grpc.aio.ServicerContext[object, object], error: Failure) -> None:
    """Set `error`'s status on the call's context, for its handler to return: gRPC discards
    the response of a call whose status is not OK."""
    status = to_grpc_status(error)
    context.set_code(status.code)
    context.set_details(status.details)
    context.set_trailing_metadata(status.trailing_metadata)


def shutting_down() -> ServiceError:
    return ServiceError(Status.UNAVAILABLE, Reason.SHUTTING_DOWN, "the sidecar is shutting down")


def unknown_session() -> ServiceError:
    return ServiceError(
        Status.FAILED_PRECONDITION,
        Reason.UNKNOWN_SESSION,
        "unknown or closed session: open one with OpenSession and name its session_id",
    )


def bad_request(reason: Reason, message: str) -> ServiceError:
    return ServiceError(Status.INVALID_ARGUMENT, reason, message)
