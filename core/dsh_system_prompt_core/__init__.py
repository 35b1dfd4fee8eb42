"""The rules the sidecar and its Python client share, with no gRPC in them.

`names` holds the constants of the contract, `render` the strict interpolation,
`reasons` the catalogue of error reasons, `stepping` how both sides write to a stream
without a task in between, `peer_text` how a peer's text is shown on a terminal or in a
log line. The client wraps a render failure as `dsp.RenderError`; the sidecar answers it
with FAILED_PRECONDITION.
"""

from .names import (
    CONTEXT_SNAPSHOT_HEADER,
    FEATURE_CALLBACK_CACHE,
    FEATURE_EACH_ANSWER,
    FEATURE_PART_SLOTS,
    FEATURE_TOOL_SLOTS,
    HARNESS_IDENTITY_ORDER,
    HARNESS_IDENTITY_SECTION,
    HARNESS_IDENTITY_TEXT,
    PERSONA_ORDER,
    PERSONA_SECTION,
    SECTION_SEPARATOR,
    TOOL_ORDER_REST,
    VARIABLE_NAME,
    is_variable_name,
    package_version,
)
from .peer_text import escape_controls
from .reasons import Reason
from .render import (
    RenderFailure,
    check_template,
    interpolate,
    references,
    render_context_snapshot,
    render_prompt,
)
from .stepping import Finished, step_through

__all__ = [
    "CONTEXT_SNAPSHOT_HEADER",
    "FEATURE_CALLBACK_CACHE",
    "FEATURE_EACH_ANSWER",
    "FEATURE_PART_SLOTS",
    "FEATURE_TOOL_SLOTS",
    "HARNESS_IDENTITY_ORDER",
    "HARNESS_IDENTITY_SECTION",
    "HARNESS_IDENTITY_TEXT",
    "PERSONA_ORDER",
    "PERSONA_SECTION",
    "SECTION_SEPARATOR",
    "TOOL_ORDER_REST",
    "VARIABLE_NAME",
    "Finished",
    "Reason",
    "RenderFailure",
    "check_template",
    "escape_controls",
    "interpolate",
    "is_variable_name",
    "package_version",
    "references",
    "render_context_snapshot",
    "render_prompt",
    "step_through",
]
