"""Config keys declared where their values live: a settings dataclass's field is one key.

A component's settings are a frozen dataclass whose fields are declared with `setting()`
(one key: its default, kind, reload rule, doc line and, when a flag mirrors it, the flag)
or `group()` (another settings dataclass, in the same TOML table or a named one). As the
Kubernetes apiserver's options structs and Envoy's typed config do, this one definition is
where parsing, the reload's diff and apply, the flags and the docs' tables all come from:
`read`, `flat`, `merged`, `declared`. A field declared neither way is not a key (a
component's own tuning, kept beside its keys).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any, TypeVar

from .kinds import ConfigError, Kind

T = TypeVar("T")
_KEY = "dsh.config.key"
_TABLE = "dsh.config.table"


class Reload(Enum):
    """When a changed value takes effect."""

    LIVE = "live"  # at the next assembly, call or session
    RESTART = "restart"  # bound into the server, its ports or its caches
    WITH_AUTH = "live with auth"  # live while some credential stays configured


@dataclass(frozen=True)
class Key:
    """One config key as declared: how it is read, when it applies, what it means."""

    kind: Kind[Any]
    doc: str
    reload: Reload = Reload.LIVE
    flag: str | None = None  # the `serve` flag that sets it too, when there is one
    shown: str | None = None  # the default as the docs show it, when not the value itself
    was: str | None = None  # the name it had before it moved, for a helpful refusal


@dataclass(frozen=True)
class Declared:
    """A key in its place: its name as the file spells it, and the fields that lead to it."""

    name: str  # "persona", "limits.max_tools", "fair_share.lag_s"
    key: Key
    default: object
    path: tuple[str, ...]  # attribute names from the root settings to the value


def setting(
    default: T,
    kind: Kind[Any],
    doc: str,
    *,
    reload: Reload = Reload.LIVE,
    flag: str | None = None,
    shown: str | None = None,
    was: str | None = None,
) -> T:
    """A settings field that is a config key (its name is the field's)."""
    key = Key(kind, doc, reload, flag, shown, was)
    return field(default=default, metadata={_KEY: key})


def group(factory: Callable[[], T], table: str = "") -> T:
    """A settings field holding more settings: its keys in `table` ([table]), else beside."""
    return field(default_factory=factory, metadata={_TABLE: table})


def declared(
    settings: type[Any], prefix: str = "", path: tuple[str, ...] = ()
) -> Iterator[Declared]:
    """Every key of `settings`, in declaration order, groups where they stand."""
    for item in fields(settings):
        if _KEY in item.metadata:
            yield Declared(
                f"{prefix}{item.name}", item.metadata[_KEY], item.default, (*path, item.name)
            )
        elif _TABLE in item.metadata:
            table = item.metadata[_TABLE]
            inner = f"{prefix}{table}." if table else prefix
            yield from declared(_type_of(settings, item), inner, (*path, item.name))


def read(settings: type[T], raw: Mapping[str, Any]) -> T:
    """`settings` from a parsed TOML document: every key checked, unknown ones refused."""
    keys = {entry.name: entry for entry in declared(settings)}
    _refuse_unknown(raw, keys, "")
    return _build(settings, raw, "")


def flat(settings: object) -> dict[str, object]:
    """The values by key name, as a reload compares them."""
    return {entry.name: _value_at(settings, entry.path) for entry in declared(type(settings))}


def merged(running: T, new: T, takes: Callable[[Key], bool]) -> T:
    """`running` with the values of `new` for every key that `takes`."""
    changes: dict[str, Any] = {}
    for item in fields(running):  # type: ignore[arg-type]
        if _KEY in item.metadata and takes(item.metadata[_KEY]):
            changes[item.name] = getattr(new, item.name)
        elif _TABLE in item.metadata:
            inner = merged(getattr(running, item.name), getattr(new, item.name), takes)
            changes[item.name] = inner
    return replace(running, **changes)  # type: ignore[type-var]


def with_values(settings: T, values: Mapping[str, object]) -> T:
    """`settings` with the keys named in `values` set to them (already read)."""
    paths = {entry.name: entry.path for entry in declared(type(settings))}
    result = settings
    for name, value in values.items():
        result = _set_at(result, paths[name], value)
    return result


def names(settings: type[Any], table: str = "") -> Any:
    """The names of `settings`' own keys as attributes (`names(Security).tls_cert_file` is
    "tls_cert_file"; `names(Limits, "limits").max_tools` is "limits.max_tools", as the file
    spells a key of the table), for the messages that name a key: so that a key is spelled
    once, where it is declared, and a renamed one cannot leave a message behind."""
    prefix = f"{table}." if table else ""
    own = {item.name: prefix + item.name for item in fields(settings) if _KEY in item.metadata}
    return types.SimpleNamespace(**own)


def _build(settings: type[T], table: Mapping[str, Any], prefix: str) -> T:
    values: dict[str, Any] = {}
    for item in fields(settings):  # type: ignore[arg-type]
        if _KEY in item.metadata and item.name in table:
            values[item.name] = item.metadata[_KEY].kind.read(prefix + item.name, table[item.name])
        elif _TABLE in item.metadata:
            name = item.metadata[_TABLE]
            inner = table.get(name, {}) if name else table
            values[item.name] = _build(
                _type_of(settings, item), inner, f"{prefix}{name}." if name else prefix
            )
    return settings(**values)


def _refuse_unknown(table: Mapping[str, Any], keys: Mapping[str, Declared], prefix: str) -> None:
    """Refuse a key no settings declare (naming where a moved one went), or a table that is
    not one."""
    for name in sorted(table):
        full = prefix + name
        if full in keys:
            continue
        if any(known.startswith(f"{full}.") for known in keys):
            if not isinstance(table[name], dict):
                raise ConfigError(f"config key '{full}' must be a table ([{full}])")
            _refuse_unknown(table[name], keys, f"{full}.")
            continue
        moved = [entry.name for entry in keys.values() if entry.key.was == full]
        if moved:
            raise ConfigError(f"config key '{full}' is now '{moved[0]}'")
        raise ConfigError(f"unknown config key '{full}'")


def _type_of(settings: type[Any], item: dataclasses.Field[Any]) -> type[Any]:
    """A group field's settings class (the factory it was declared with)."""
    factory = item.default_factory
    assert isinstance(factory, type), f"{settings.__name__}.{item.name} is a group of a class"
    return factory


def _value_at(settings: object, path: tuple[str, ...]) -> object:
    for name in path:
        settings = getattr(settings, name)
    return settings


def _set_at(settings: T, path: tuple[str, ...], value: object) -> T:
    head, *rest = path
    inner = _set_at(getattr(settings, head), tuple(rest), value) if rest else value
    return replace(settings, **{head: inner})  # type: ignore[type-var]
