"""The registry's part of the sidecar config, and its keys as a reload compares them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .limits import Limits


@dataclass(frozen=True)
class RegistrySettings:
    """The registry's part of the sidecar config (the spec's defaults)."""

    persona: str = ""
    include_harness_identity: bool = True
    include_runtime_context: bool = True
    tool_order: tuple[str, ...] | None = None
    provider_timeout_s: float = 5.0
    eject_after_timeouts: int = 1  # consecutive timeouts that eject a callback; 0: never
    max_callback_timeout_s: float = 60.0  # the longest timeout_s a callback may declare
    limits: Limits = field(default_factory=Limits)
    change_history: int = 1024  # change events kept for watchers that resume


def settings_keys(settings: RegistrySettings) -> dict[str, object]:
    """The settings by config key (`limits.max_tools` for a limit), as reload compares them."""
    flat: dict[str, object] = {
        f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "limits"
    }
    for limit in fields(settings.limits):
        flat[f"limits.{limit.name}"] = getattr(settings.limits, limit.name)
    return flat
