"""SystemPromptError: every failure, with the gRPC status code and the sidecar's words."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2


class SystemPromptError(Exception):
    """A failure reported by (or on the way to) the sidecar.

    `code` is the gRPC status code, `reason` the stable ErrorInfo reason
    (e.g. "DUPLICATE_NAME"), and the message is the sidecar's own text.
    """

    def __init__(self, message: str, code: grpc.StatusCode, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


class RenderError(SystemPromptError):
    """Strict interpolation failed (locally or on the sidecar)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, grpc.StatusCode.FAILED_PRECONDITION, "RENDER_FAILED")


def error_from_rpc(error: grpc.RpcError) -> SystemPromptError:
    """The SystemPromptError for a failed call, with the ErrorInfo reason if sent."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = (error.details() if hasattr(error, "details") else None) or str(code)
    reason = _reason(error)
    if reason == "RENDER_FAILED":
        return RenderError(message)
    if code == grpc.StatusCode.UNAVAILABLE and not reason:
        message = f"sidecar unavailable: {message}"
    return SystemPromptError(message, code, reason)


def _reason(error: grpc.RpcError) -> str:
    # The google.rpc.Status travels in the trailers; its ErrorInfo holds the reason.
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == _DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return str(info.reason)
    return ""


_DETAILS_KEY = "grpc-status-details-bin"
