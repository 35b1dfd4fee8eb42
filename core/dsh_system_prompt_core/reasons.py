"""Every error reason the sidecar or a client reports: the catalogue, in one place.

Each value is the `google.rpc.ErrorInfo.reason` string on the wire (and the
`dsh-error-reason` trailer), and the name of a value of the proto's
`ErrorReason` enum; a test keeps the two the same. Clients branch on these,
never on message texts.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """A stable, machine-readable cause of a failure (compares equal to its string)."""

    # -- registrations (INVALID_ARGUMENT, ALREADY_EXISTS, NOT_FOUND) -------------------
    DUPLICATE_NAME = "DUPLICATE_NAME"
    """A section, context or variable name already registered in that layer."""
    INVALID_NAME = "INVALID_NAME"
    """An empty section, context or static tool name."""
    INVALID_ORDER = "INVALID_ORDER"
    """A section or context order that is not a finite number."""
    INVALID_VARIABLE_NAME = "INVALID_VARIABLE_NAME"
    """A variable name that does not match ^[a-z][a-z0-9_]*$."""
    INVALID_JSON = "INVALID_JSON"
    """Assemble fields or tool parameters that are not a JSON object."""
    MISSING_VALUE = "MISSING_VALUE"
    """A registration with neither a static value nor a dynamic provider."""
    DUPLICATE_PROVIDER_KEY = "DUPLICATE_PROVIDER_KEY"
    """A provider key already used by a live registration of the same session."""
    VALUE_TOO_LARGE = "VALUE_TOO_LARGE"
    """A name, text, JSON value or request over a configured size limit."""
    INVALID_SCOPE = "INVALID_SCOPE"
    """An empty scope key."""
    SCOPE_PARENT_CONFLICT = "SCOPE_PARENT_CONFLICT"
    """A scope key whose parent is already bound to another key."""
    SCOPE_CYCLE = "SCOPE_CYCLE"
    """A scope parent that would close a cycle."""
    SCOPE_NOT_FOUND = "SCOPE_NOT_FOUND"
    """A scope handle id that this session does not hold."""
    REGISTRATION_NOT_FOUND = "REGISTRATION_NOT_FOUND"
    """Disposing (or updating) what does not exist or belongs to another session."""
    NOT_UPDATABLE = "NOT_UPDATABLE"
    """Updating what has no static value: a dynamic registration, a suppressor, listener, scope."""
    WRONG_VALUE_KIND = "WRONG_VALUE_KIND"
    """An update whose value does not fit the registration's kind (e.g. tools for a section)."""
    REPORT_NOT_FOUND = "REPORT_NOT_FOUND"
    """Usage reported for a history key with no reported assembly (NOT_FOUND)."""
    INVALID_TOOL_ORDER = "INVALID_TOOL_ORDER"
    """A tool_order without its rest entry, or listing a name twice (config)."""

    # -- assemblies and renders (FAILED_PRECONDITION) ----------------------------------
    MULTIPLE_COMPLETE_SECTIONS = "MULTIPLE_COMPLETE_SECTIONS"
    """More than one effective complete section."""
    UNKNOWN_TOOL_ORDER_NAME = "UNKNOWN_TOOL_ORDER_NAME"
    """tool_order lists a name no tool provider knows."""
    RESERVED_TOOL_NAME = "RESERVED_TOOL_NAME"
    """A static tool list, or a tool provider's answer, holds the reserved name <unlisted-tools>."""
    INVARIANT_VIOLATION = "INVARIANT_VIOLATION"
    """What the waterfall returned breaks an assembly invariant."""
    RENDER_FAILED = "RENDER_FAILED"
    """Strict interpolation failed."""
    BAD_TOOL_SLOT = "BAD_TOOL_SLOT"
    """Reserved: a listener reply's bad tool slot fails the assembly with LISTENER_FAILED."""

    # -- callbacks (ABORTED, DEADLINE_EXCEEDED, UNAVAILABLE) ---------------------------
    PROVIDER_FAILED = "PROVIDER_FAILED"
    """A dynamic provider raised, or answered with the wrong kind of value."""
    PROVIDER_TIMEOUT = "PROVIDER_TIMEOUT"
    """A dynamic provider did not answer in time."""
    PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
    """The session that registered a needed provider has ended."""
    LISTENER_FAILED = "LISTENER_FAILED"
    """A listener raised or broke its stream's protocol."""
    LISTENER_TIMEOUT = "LISTENER_TIMEOUT"
    """A listener did not answer in time."""
    LISTENER_UNAVAILABLE = "LISTENER_UNAVAILABLE"
    """A listener's stream has closed."""

    # -- sessions, streams and the sidecar ---------------------------------------------
    UNKNOWN_SESSION = "UNKNOWN_SESSION"
    """A call naming a session id that is not open (FAILED_PRECONDITION)."""
    BAD_STREAM = "BAD_STREAM"
    """A stream that did not start with its start message (INVALID_ARGUMENT)."""
    QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
    """A count limit (sessions, registrations, listeners, watchers) is reached."""
    UNAUTHENTICATED = "UNAUTHENTICATED"
    """A call without the configured bearer token."""
    SHUTTING_DOWN = "SHUTTING_DOWN"
    """The sidecar is draining after SIGTERM (UNAVAILABLE)."""

    # -- raised by clients, never sent by the sidecar ----------------------------------
    SIDECAR_UNAVAILABLE = "SIDECAR_UNAVAILABLE"
    """The sidecar cannot be reached, or the connection is being re-established."""
    SESSION_CLOSED = "SESSION_CLOSED"
    """A call on a client that was closed."""
    INVALID_VALUE = "INVALID_VALUE"
    """A value the client refused before sending it (a wrong type, not JSON-serialisable)."""
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    """The sidecar sent something the client cannot make sense of."""
    UNKNOWN = "UNKNOWN"
    """A failure that carried no reason (an older sidecar, or a proxy in between)."""

    # -- peers and sizes (RESOURCE_EXHAUSTED), added after the client-side reasons ------
    STREAM_STALLED = "STREAM_STALLED"
    """A peer did not read its stream in time, or left too much unread: it was closed."""
    RESPONSE_TOO_LARGE = "RESPONSE_TOO_LARGE"
    """An assembly (or its report) too large for one message of the configured size."""

    # -- roles (PERMISSION_DENIED), added after the sizes ------------------------------
    PERMISSION_DENIED = "PERMISSION_DENIED"
    """The call's credential may not do this; the message names what it lacks."""

    # -- rules (INVALID_ARGUMENT at registration, ABORTED at assembly), added after roles
    RULE_INVALID = "RULE_INVALID"
    """A rule that does not compile; the message names the rule, the expression and CEL's words."""
    RULE_FAILED = "RULE_FAILED"
    """A rule's expression failed at assembly (under FAIL); the message names both."""

    # -- the tool freeze (FAILED_PRECONDITION at assembly), added after rules ----------
    TOOLS_FROZEN = "TOOLS_FROZEN"
    """A reported assembly whose tools differ from the ones its history key froze."""

    # -- reach (a skipped step only, never a failure), added after the tool freeze -----
    OUT_OF_REACH = "OUT_OF_REACH"
    """A step or dynamic provider passed over: its owner's credential may not read the scope."""
