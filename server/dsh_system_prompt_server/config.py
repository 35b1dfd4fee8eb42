"""The sidecar's TOML config, validated at start."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .registry import RegistryError, RegistrySettings, validate_tool_order

T = TypeVar("T")


class ConfigError(Exception):
    """The config cannot be used; the message names the key and what is wrong."""


@dataclass(frozen=True)
class SidecarConfig:
    """Everything the sidecar reads from its config file."""

    registry: RegistrySettings = field(default_factory=RegistrySettings)
    shutdown_grace_s: float = 5.0
    watch_buffer: int = 1024


_KNOWN_KEYS = {
    "persona",
    "include_harness_identity",
    "include_runtime_context",
    "tool_order",
    "provider_timeout_s",
    "shutdown_grace_s",
    "watch_buffer",
}


def load_config(path: str | Path | None) -> SidecarConfig:
    """Read and validate `path`; None gives the defaults."""
    if path is None:
        return SidecarConfig()
    try:
        with open(path, "rb") as file:
            raw = tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    return parse_config(raw)


def parse_config(raw: dict[str, Any]) -> SidecarConfig:
    """Validate a parsed config table."""
    unknown = sorted(set(raw) - _KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]!r}")
    tool_order = raw.get("tool_order")
    if tool_order is not None:
        if not isinstance(tool_order, list) or not all(isinstance(n, str) for n in tool_order):
            raise ConfigError("config key 'tool_order' must be a list of tool names")
        try:
            tool_order = validate_tool_order(tool_order)
        except RegistryError as error:
            raise ConfigError(error.message) from None
    registry = RegistrySettings(
        persona=_typed(raw, "persona", str, ""),
        include_harness_identity=_typed(raw, "include_harness_identity", bool, True),
        include_runtime_context=_typed(raw, "include_runtime_context", bool, True),
        tool_order=tool_order,
        provider_timeout_s=_seconds(raw, "provider_timeout_s", 5.0),
    )
    watch_buffer = _typed(raw, "watch_buffer", int, 1024)
    if watch_buffer < 1:
        raise ConfigError("config key 'watch_buffer' must be at least 1")
    return SidecarConfig(
        registry=registry,
        shutdown_grace_s=_seconds(raw, "shutdown_grace_s", 5.0, allow_zero=True),
        watch_buffer=watch_buffer,
    )


def _typed(raw: dict[str, Any], key: str, kind: type[T], default: T) -> T:
    value = raw.get(key, default)
    # bool is an int in Python; a flag is not a number here, nor the reverse.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"config key '{key}' must be a {kind.__name__}, not {value!r}")
    return value


def _seconds(raw: dict[str, Any], key: str, default: float, allow_zero: bool = False) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config key '{key}' must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "at least 0" if allow_zero else "greater than 0"
        raise ConfigError(f"config key '{key}' must be a finite number {bound}, not {value!r}")
    return float(value)
