"""Registry failures: a status, a stable reason and the spec's message.

The registry knows nothing of gRPC; `Status` names the gRPC code each failure
maps to, and the service layer translates it. Every one is a `Failure`: a
`RegistryError` when the registry's rules refuse, a `ServiceError` for what fails
outside them (a request's wire form, a session, a host, credentials, draining).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

from dsh_system_prompt_core import Reason

# A step's own failures: a callback raised or broke its protocol, did not answer in time, or its
# stream is gone; a rule's expression failed (what assemblies fail with, or skip it for).
CALLBACK_FAILURES = frozenset(
    {
        Reason.PROVIDER_FAILED,
        Reason.PROVIDER_TIMEOUT,
        Reason.PROVIDER_UNAVAILABLE,
        Reason.LISTENER_FAILED,
        Reason.LISTENER_TIMEOUT,
        Reason.LISTENER_UNAVAILABLE,
        Reason.RULE_FAILED,
    }
)


class Status(enum.Enum):
    """The status class of a failure; values are gRPC status code names."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAVAILABLE = "UNAVAILABLE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    CANCELLED = "CANCELLED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"


class Failure(Exception):
    """Any failure a caller is told about: a status class, a stable reason, the message."""

    def __init__(self, status: Status, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        # the callback whose own failure this is (a model.Skipped), when it fails an assembly
        self.step: Any = None


class RegistryError(Failure):
    """The registry's own rules refused a registration, disposal or assembly."""


class ServiceError(Failure):
    """A failure found outside the registry's rules: a request's wire form, a session or
    stream, credentials, a provider or listener host, or the sidecar going away."""


# The registry's refusals by status class: each reason below always goes with one of them.
def _invalid(reason: Reason, message: str) -> RegistryError:
    return RegistryError(Status.INVALID_ARGUMENT, reason, message)


def _taken(reason: Reason, message: str) -> RegistryError:
    return RegistryError(Status.ALREADY_EXISTS, reason, message)


def _missing(reason: Reason, message: str) -> RegistryError:
    return RegistryError(Status.NOT_FOUND, reason, message)


def _precondition(reason: Reason, message: str) -> RegistryError:
    return RegistryError(Status.FAILED_PRECONDITION, reason, message)


def quoted_list(names: Iterable[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


def duplicate_entry(noun: str, name: str, scope: str | None) -> RegistryError:
    """`prompt section "x" is already registered` (global) or `... in this scope`."""
    message = f'{noun} "{name}" is already registered'
    if scope is not None:
        message += " in this scope"
    elif noun != "prompt variable":
        message += " (for a per-agent override, register through that agent's scope instead)"
    return _taken(Reason.DUPLICATE_NAME, message)


def duplicate_rule(name: str, scope: str | None) -> RegistryError:
    """A rule's name is unique among the rules of its layer: errors and skipped steps name it."""
    where = " in this scope" if scope is not None else ""
    return _taken(Reason.DUPLICATE_NAME, f'rule "{name}" is already registered{where}')


def reserved_builtin(name: str) -> RegistryError:
    """A built-in section's name in the global layer while the config switches it off."""
    return _taken(
        Reason.DUPLICATE_NAME,
        f'prompt section "{name}" is reserved for the built-in section (switched off in the'
        " config, it comes back at a reload); for a per-agent override, register through"
        " that agent's scope instead",
    )


def invalid_order(noun: str, name: str) -> RegistryError:
    return _invalid(Reason.INVALID_ORDER, f'{noun} "{name}" order must be a finite number')


def empty_name(noun: str) -> RegistryError:
    return _invalid(Reason.INVALID_NAME, f"{noun} names must be non-empty")


def invalid_variable_name(name: str) -> RegistryError:
    return _invalid(
        Reason.INVALID_VARIABLE_NAME,
        f'invalid prompt variable name "{name}" (must match /^[a-z][a-z0-9_]*$/)',
    )


def not_found() -> RegistryError:
    return _missing(
        Reason.REGISTRATION_NOT_FOUND,
        "no such registration in this session (already disposed, or never registered here)",
    )


def scope_not_found() -> RegistryError:
    return _missing(Reason.SCOPE_NOT_FOUND, "no such scope handle in this session")


def not_updatable(kind: str, name: str) -> RegistryError:
    label = f'{kind} "{name}"' if name else f"this {kind}"
    why = (
        "it has no value to replace"
        if kind in ("suppressor", "listener", "scope")
        else "its value comes from a dynamic provider, which already gives the latest one"
    )
    return _precondition(Reason.NOT_UPDATABLE, f"{label} cannot be updated: {why}")


def wrong_value_kind(label: str, wanted: str) -> RegistryError:
    return _invalid(
        Reason.WRONG_VALUE_KIND,
        f"an update of {label} needs {wanted}",
    )


def multiple_complete(names: Iterable[str]) -> RegistryError:
    return _precondition(
        Reason.MULTIPLE_COMPLETE_SECTIONS,
        f"multiple complete prompt sections are active: {quoted_list(names)}",
    )


def reserved_tool_name(rest: str) -> RegistryError:
    return _precondition(
        Reason.RESERVED_TOOL_NAME,
        f'tool provider returned reserved tool name "{rest}"'
        " (reserved for toolOrder's rest entry)",
    )


def unknown_tool_order_names(unknown: list[str], known: list[str]) -> RegistryError:
    noun = "tool" if len(unknown) == 1 else "tools"
    known_text = ", ".join(known) if known else "(none)"
    return _precondition(
        Reason.UNKNOWN_TOOL_ORDER_NAME,
        f"toolOrder lists unregistered {noun} {quoted_list(unknown)}; known tools: {known_text}",
    )


def invariant(message: str) -> RegistryError:
    return _precondition(Reason.INVARIANT_VIOLATION, message)


def malformed_template(message: str) -> RegistryError:
    """A static text whose {{ }} reference can never render: it would fail every assembly."""
    return _precondition(Reason.RENDER_FAILED, message)


def duplicate_provider_key(key: str) -> RegistryError:
    """A session answers provider requests by key, so a live key cannot be given twice."""
    return _taken(
        Reason.DUPLICATE_PROVIDER_KEY,
        f'provider key "{key}" is already in use by another registration of this session',
    )
