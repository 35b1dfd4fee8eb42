"""The registry's part of the sidecar config: its config keys, declared with their values."""

from __future__ import annotations

from dataclasses import dataclass

from dsh_system_prompt_core import PERSONA_SECTION, RenderFailure, check_template

from ..config import Choice, ConfigError, Count, Custom, Flag, Seconds, group, names, setting
from .assembly import validate_tool_order
from .errors import RegistryError
from .limits import Limits
from .rules import OperatorRule, read_rules

MAX_HISTORY = 1_000_000  # change events kept for resuming watchers, at most
MAX_EJECT_AFTER = 1_000  # consecutive timeouts before a callback is ejected, at most


def _persona(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"config key '{name}' must be text, not {value!r}")
    try:
        check_template(value, f'section "{PERSONA_SECTION}"')
    except RenderFailure as error:  # it would fail every render of the pod
        raise ConfigError(f"config key '{name}': {error}") from None
    return value


def _tool_order(name: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(tool, str) for tool in value):
        raise ConfigError(f"config key '{name}' must be a list of tool names")
    try:
        return validate_tool_order(value)
    except RegistryError as error:
        raise ConfigError(error.message) from None


@dataclass(frozen=True)
class RegistrySettings:
    """The registry's part of the sidecar config (the spec's defaults)."""

    persona: str = setting(
        "", Custom(_persona, "a template"), "the global `deployment:persona` section"
    )
    include_harness_identity: bool = setting(True, Flag(), "register `harness:identity`")
    include_runtime_context: bool = setting(
        True, Flag(), "`false` suppresses every runtime context"
    )
    tool_order: tuple[str, ...] | None = setting(
        None,
        Custom(_tool_order, 'tool names with one "<unlisted-tools>"'),
        "the model-facing tool order",
    )
    tool_order_mode: str = setting(
        "sorted",
        Choice(("sorted", "stable")),
        '"stable": in a reported assembly the tools `tool_order` does not place keep the'
        " places they had in the history key's last report, new ones appended"
        " (docs/prompt-cache.md, A stable tool order)",
    )
    provider_timeout_s: float = setting(
        5.0,
        Seconds(),
        "how long one provider or listener answer may take, unless it declares its own `timeout_s`",
    )
    eject_after_timeouts: int = setting(
        1,
        Count(least=0, most=MAX_EJECT_AFTER, zero="never"),
        "consecutive timeouts of a callback's whole time after which a provider or listener is"
        " ejected: disposed, with a change event saying why (docs/protocol.md, Ejected"
        " callbacks)",
    )
    max_callback_timeout_s: float = setting(
        60.0,
        Seconds(),
        "the longest `timeout_s` a provider or listener may declare at registration"
        " (INVALID_ARGUMENT `VALUE_TOO_LARGE` past it); at least `provider_timeout_s`",
    )
    limits: Limits = group(Limits, "limits")
    rules: tuple[OperatorRule, ...] = setting(
        (),
        Custom(read_rules, "[[rules]] tables"),
        "the operator's rules (docs/protocol.md, Rules), the sidecar's own: each a `name`, an"
        " optional `scope` key or pattern (`agent-*`; none: every assembly), `prepend`, and"
        " its `match`, `variables`, `mutations` and `failure_policy` as in RuleSpec",
    )
    change_history: int = setting(
        1024,
        Count(most=MAX_HISTORY),
        "change events kept for watchers that resume (`WatchChanges.after_revision`)",
    )


def check_callback_timeouts(settings: RegistrySettings) -> None:
    """The default time must be one a callback may declare."""
    if settings.max_callback_timeout_s < settings.provider_timeout_s:
        keys = names(RegistrySettings)
        most, default = keys.max_callback_timeout_s, keys.provider_timeout_s
        raise ConfigError(
            f"config key '{most}' ({settings.max_callback_timeout_s:g}) must be at least"
            f" '{default}' ({settings.provider_timeout_s:g})"
        )
