"""`serve`'s flags that mirror config keys, made from the keys' declarations."""

from __future__ import annotations

import argparse
from typing import Any

from .keys import Declared, declared
from .kinds import Choice, Count, Flag, Named, Number, Seconds


def add_flags(parser: argparse.ArgumentParser, settings: type[Any]) -> None:
    """A flag for every key declared with one; its help is the key's doc."""
    for entry in _flagged(settings):
        kind = entry.key.kind
        options: dict[str, Any] = {"dest": _dest(entry), "default": None}
        options["help"] = f"{entry.key.doc} (config key {entry.name})".replace("%", "%%")
        if isinstance(kind, Flag):  # a key off by default is turned on; else either way
            on = entry.default is False
            options["action"] = "store_true" if on else argparse.BooleanOptionalAction
        elif isinstance(kind, Choice | Named):
            options["choices"] = kind.bounds().replace('"', "").split(", ")
        elif isinstance(kind, Count):
            options["type"] = int
        elif isinstance(kind, Seconds | Number):
            options["type"] = float
        parser.add_argument(entry.key.flag, **options)  # type: ignore[arg-type]


def flag_values(args: argparse.Namespace, settings: type[Any]) -> dict[str, object]:
    """The keys the command line gave, by name, read as the config file's values are."""
    given: dict[str, object] = {}
    for entry in _flagged(settings):
        value = getattr(args, _dest(entry))
        if value is not None:
            given[entry.name] = entry.key.kind.read(entry.name, value)
    return given


def _flagged(settings: type[Any]) -> list[Declared]:
    return [entry for entry in declared(settings) if entry.key.flag]


def _dest(entry: Declared) -> str:
    return entry.name.replace(".", "__")
