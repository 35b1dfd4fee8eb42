"""What the registry admits: names, values and templates checked, quotas and the byte budget.

Every check runs before the registry changes anything, so a refused registration
or update leaves no trace. `Admission` holds what the checks count across
registrations: the bytes registered against `limits.max_total_bytes`, the bytes and
listeners of each client (`accounts.py`), and the provider keys live per session (a
session answers by key, so one each).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from dsh_system_prompt_core import (
    HARNESS_IDENTITY_SECTION,
    PERSONA_SECTION,
    TOOL_ORDER_REST,
    Reason,
    RenderFailure,
    check_template,
)

from . import errors
from .accounts import Accounts
from .layers import Layer
from .limits import Limits, quota_exceeded, value_bytes
from .model import (
    SIDECAR_OWNER,
    AnyRegistration,
    ContextRegistration,
    Dynamic,
    Kind,
    SectionRegistration,
    ToolSet,
)
from .settings import RegistrySettings

# What an update may put in place of a static value: text, a variable's None, tools.
StaticValue = str | None | ToolSet

# Reserved in the global layer, even while the config switches one off: it may come back.
BUILTIN_SECTIONS = frozenset({HARNESS_IDENTITY_SECTION, PERSONA_SECTION})


class Admission:
    """The limits in force (the live settings' ones), and what they are counted against."""

    def __init__(self, settings: Callable[[], RegistrySettings]) -> None:
        self._settings = settings  # the registry's, as a reload leaves them
        self.total_bytes = 0  # what sessions registered, against limits.max_total_bytes
        self.clients = Accounts()  # what each client's sessions hold, against its quotas
        # (owner, provider key) of live dynamic entries: a session answers by key, so one each.
        self._provider_keys: set[tuple[str, str]] = set()

    @property
    def limits(self) -> Limits:
        return self._settings().limits

    def check_text(
        self,
        owner: str,
        owned: int,
        noun: Literal["section", "context"],
        name: str,
        order: float,
        text: str | Dynamic,
        layer: Layer,
        scope: str | None,
    ) -> None:
        """A new section or context (`noun`) of `owner`, who has `owned` registrations: its
        name and order unique in its `layer` (of `scope`), its text within limits and parsing."""
        existing = layer.sections if noun == "section" else layer.contexts
        self._check_named(f"prompt {noun}", name, order, existing, scope)
        self.check_value(owner, owned, f'prompt {noun} "{name}" text', text)
        check_text_template(text, f'{noun} "{name}"')

    def _check_named(
        self,
        noun: str,
        name: str,
        order: float,
        existing: dict[str, SectionRegistration] | dict[str, ContextRegistration],
        scope: str | None,
    ) -> None:
        if not name:
            raise errors.empty_name(noun)
        self.limits.check_name(noun, name)
        if not math.isfinite(order):
            raise errors.invalid_order(noun, name)
        if name in existing:
            raise errors.duplicate_entry(noun, name, scope)
        if scope is None and noun == "prompt section" and name in BUILTIN_SECTIONS:
            raise errors.reserved_builtin(name)  # switched off now, it may come back at a reload

    def check_value(self, owner: str, owned: int, what: str, value: str | Dynamic | None) -> None:
        """A text or variable value of `owner`, who has `owned` registrations already."""
        if isinstance(value, str):
            self.limits.check_text(what, value)
        self.check_provider_key(owner, value)
        self.check_quota(owned)
        self.check_bytes(owner, value_bytes(value))

    def check_tools(self, owner: str, owned: int, source: ToolSet | Dynamic) -> None:
        """A tool provider of `owner`: static schemas within limits, then quota and budget."""
        if isinstance(source, ToolSet):
            self.limits.check_tools(source)
            check_tool_names(source)
        self.check_provider_key(owner, source)
        self.check_quota(owned)
        self.check_bytes(owner, value_bytes(source))

    def check_bytes(self, owner: str, adding: int) -> None:
        """`owner` may register `adding` bytes more: the sidecar's budget, then its client's."""
        self.limits.check_total(self.total_bytes, adding)
        self.clients.check_bytes(owner, adding, self.limits)

    def check_provider_key(self, owner: str, value: object) -> None:
        if isinstance(value, Dynamic) and (owner, value.key) in self._provider_keys:
            raise errors.duplicate_provider_key(value.key)
        if isinstance(value, Dynamic):
            self.check_timeout("provider", value.timeout_s)

    def check_timeout(self, what: str, timeout_s: float | None) -> None:
        """A callback's own timeout is bounded: an honest slow one says so, up to a bound."""
        bound = self._settings().max_callback_timeout_s
        if timeout_s is not None and timeout_s > bound:
            raise errors.RegistryError(
                errors.Status.INVALID_ARGUMENT,
                Reason.VALUE_TOO_LARGE,
                f"a {what}'s timeout_s of {timeout_s:g}s is over the limit of {bound:g}s"
                " (max_callback_timeout_s)",
            )

    def check_quota(self, owned: int) -> None:
        """A session with `owned` registrations may make one more."""
        if owned >= self.limits.max_registrations_per_session:
            raise quota_exceeded(
                f"this session already has {owned} registrations, the limit per session"
            )

    def check_listeners(self, owner: str, listeners: int, timeout_s: float | None = None) -> None:
        """The sidecar, with `listeners` installed, may install one more for `owner` (that
        may take `timeout_s` to answer), and so may `owner`'s client."""
        self.check_timeout("listener", timeout_s)
        if listeners >= self.limits.max_listeners:
            raise quota_exceeded(f"the sidecar already has {listeners} listeners, its limit")
        self.clients.check_listener(owner, self.limits)

    def check_rules(self, rules: int, owned: int) -> None:
        """The sidecar, with `rules` of sessions installed, may install one more, and so may
        a session holding `owned` of them."""
        limits = self.limits
        if rules >= limits.max_rules:
            raise quota_exceeded(
                f"the sidecar already has {rules} rules, its limit (limits.max_rules)"
            )
        if owned >= limits.max_rules_per_session:
            raise quota_exceeded(
                f"this session already has {owned} rules, the limit per session"
                " (limits.max_rules_per_session)"
            )

    def check_update(self, entry: AnyRegistration, value: StaticValue) -> None:
        """The checks registration makes of a value of the entry's kind."""
        label = f'{entry.kind.value} "{entry.name}"' if entry.name else entry.kind.value
        if entry.kind is Kind.TOOLS:
            if not isinstance(value, ToolSet):
                raise errors.wrong_value_kind(label, "a tool result")
            self.limits.check_tools(value)
            check_tool_names(value)
            return
        if value is None and entry.kind is Kind.VARIABLE:
            return
        if not isinstance(value, str):
            wanted = "a value or no value" if entry.kind is Kind.VARIABLE else "a text"
            raise errors.wrong_value_kind(label, wanted)
        noun = {Kind.SECTION: "prompt section", Kind.CONTEXT: "prompt context"}.get(entry.kind)
        if noun is None:
            self.limits.check_text(f'prompt variable "{entry.name}" value', value)
            return
        self.limits.check_text(f'{noun} "{entry.name}" text', value)
        check_text_template(value, f'{entry.kind.value} "{entry.name}"')

    def grow(self, entry: AnyRegistration, value: StaticValue) -> None:
        """Count the change in size of replacing the entry's value, or refuse it."""
        growth = value_bytes(value) - value_bytes(entry.value)
        self.check_bytes(entry.owner, growth)
        self.total_bytes += growth
        self.clients.count(entry.owner, growth, 0)

    def admitted(self, entry: AnyRegistration) -> None:
        """Count a registration in: its provider key, and its bytes (the config's are free)."""
        if isinstance(entry.value, Dynamic):
            self._provider_keys.add((entry.owner, entry.value.key))
        if entry.owner != SIDECAR_OWNER:
            self.total_bytes += value_bytes(entry.value)
        self.clients.count(entry.owner, value_bytes(entry.value), _listener(entry))

    def released(self, entry: AnyRegistration) -> None:
        """Count a disposed registration out."""
        if isinstance(entry.value, Dynamic):
            self._provider_keys.discard((entry.owner, entry.value.key))
        if entry.owner != SIDECAR_OWNER:
            self.total_bytes -= value_bytes(entry.value)
        self.clients.count(entry.owner, -value_bytes(entry.value), -_listener(entry))


def _listener(entry: AnyRegistration) -> int:
    return 1 if entry.kind is Kind.LISTENER else 0


def check_tool_names(tools: ToolSet) -> None:
    # A static tool that no assembly can ship would fail every assembly that sees it.
    for tool in tools.schemas:
        if not tool.name:
            raise errors.empty_name("tool")
        if tool.name == TOOL_ORDER_REST:
            raise errors.reserved_tool_name(TOOL_ORDER_REST)


def check_text_template(text: str | Dynamic, where: str) -> None:
    """A static text's template must parse; a provider's text is checked when rendered."""
    if isinstance(text, str):
        try:
            check_template(text, where)
        except RenderFailure as error:
            raise errors.malformed_template(str(error)) from None
