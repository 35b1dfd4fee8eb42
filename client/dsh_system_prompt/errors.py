"""SystemPromptError: every failure, with the gRPC status code and the sidecar's words."""

from __future__ import annotations

import grpc


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
