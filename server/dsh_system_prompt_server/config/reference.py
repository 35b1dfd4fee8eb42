"""The docs' tables of config keys, made from their declarations (docs/operations.md)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from .keys import Declared, declared

HEADER = "| key | default | values | reload | meaning |\n|---|---|---|---|---|"


def tables(settings: type[Any]) -> dict[str, str]:
    """Each TOML table's keys as a Markdown table: "" for the top level, then "limits", ..."""
    rows: dict[str, list[str]] = {}
    for entry in declared(settings):
        table, _, name = entry.name.rpartition(".")
        rows.setdefault(table, []).append(_row(name, entry))
    return {table: "\n".join([HEADER, *lines]) for table, lines in rows.items()}


def _row(name: str, entry: Declared) -> str:
    key = entry.key
    default = key.shown if key.shown is not None else shown(entry.default)
    doc = f"{key.doc}; as `{key.flag}`" if key.flag else key.doc
    cells = (f"`{name}`", default, key.kind.bounds(), key.reload.value, doc)
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def shown(value: object) -> str:
    """A default as TOML spells it."""
    if value is None:
        return "absent"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "none" if not value else f"`{list(value)!r}`"
    return f"`{value!r}`"
