"""SystemPromptError: every failure, with its gRPC status code, reason and the sidecar's words."""

from __future__ import annotations

import grpc
from dsh_system_prompt_core import Reason
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

_REASON_TRAILER = "dsh-error-reason"


class SystemPromptError(Exception):
    """A failure reported by (or on the way to) the sidecar.

    `code` is the gRPC status code, `reason` the stable reason (a `dsp.Reason`,
    or the plain string a newer sidecar sent), and `message` the sidecar's own
    text; `str(error)` shows all three: `UNAVAILABLE SIDECAR_UNAVAILABLE: ...`.
    """

    def __init__(self, message: str, code: grpc.StatusCode, reason: Reason | str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code.name} {self.reason}: {self.message}"


class RenderError(SystemPromptError):
    """Strict interpolation failed (locally or on the sidecar)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, grpc.StatusCode.FAILED_PRECONDITION, Reason.RENDER_FAILED)


def error_from_rpc(error: grpc.RpcError) -> SystemPromptError:
    """The SystemPromptError for a failed call, with the reason the sidecar sent."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or str(code)
    reason = _reason(error)
    if reason == Reason.RENDER_FAILED:
        return RenderError(message)
    if reason is Reason.UNKNOWN and code == grpc.StatusCode.UNAVAILABLE:
        return SystemPromptError(
            f"sidecar unavailable: {message}", code, Reason.SIDECAR_UNAVAILABLE
        )
    return SystemPromptError(message, code, reason)


def as_reason(value: str) -> Reason | str:
    """The catalogue's member for `value`; a reason this client does not know stays a str."""
    try:
        return Reason(value)
    except ValueError:
        return value


def _reason(error: grpc.RpcError) -> Reason | str:
    """The ErrorInfo reason in the status details, else the plain trailer, else UNKNOWN."""
    status = _status(error)
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return as_reason(info.reason)
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == _REASON_TRAILER and value:
            return as_reason(value)
    return Reason.UNKNOWN


def _status(error: grpc.RpcError) -> status_pb2.Status | None:
    if not hasattr(error, "trailing_metadata"):
        return None
    try:
        return rpc_status.from_call(error)
    except ValueError:  # details that disagree with the status line: ignore them
        return None


def invalid_value(message: str) -> SystemPromptError:
    """A value refused in the client, before anything was sent."""
    return SystemPromptError(message, grpc.StatusCode.INVALID_ARGUMENT, Reason.INVALID_VALUE)


def stream_ended(message: str, code: grpc.StatusCode) -> SystemPromptError:
    """A stream the sidecar ended before confirming it (it is going away, or refused it),
    or one it should never end; OK then says nothing, so it is UNAVAILABLE."""
    if code == grpc.StatusCode.OK:
        code = grpc.StatusCode.UNAVAILABLE
    return SystemPromptError(f"sidecar unavailable: {message}", code, Reason.SIDECAR_UNAVAILABLE)


def protocol_error(message: str) -> SystemPromptError:
    """The sidecar sent what this protocol does not allow (a buggy or hostile sidecar)."""
    return SystemPromptError(
        f"protocol error: {message}", grpc.StatusCode.INTERNAL, Reason.PROTOCOL_ERROR
    )


class NoAnswer(SystemPromptError):
    """The sidecar took a call and did not answer it in time: treat it as unreachable."""

    def __init__(self, what: str, timeout: float) -> None:
        super().__init__(
            f"sidecar unavailable: no answer to {what} within {timeout:g}s",
            grpc.StatusCode.UNAVAILABLE,
            Reason.SIDECAR_UNAVAILABLE,
        )
