"""Config keys: how a component declares them in its settings (`setting`, `group`), what
values each takes (`kinds`), and what is made from the declarations: reading a TOML
document, the values a reload compares and takes, `serve`'s flags, the docs' tables.

It is the lowest floor of `LAYERS` in tests/package/test_package.py: it imports nothing of
the package, so that every component declares its own keys beside the values they feed (the
registry's in `registry/`, the shares' in `guard/`, ...) and the sidecar composes them into
the one config (`sidecar/config.py`).
"""

from .flags import add_flags, flag_values
from .keys import (
    Declared,
    Key,
    Reload,
    declared,
    flat,
    group,
    merged,
    names,
    read,
    setting,
    with_values,
)
from .kinds import (
    MAX_COUNT,
    MAX_SECONDS,
    Choice,
    ConfigError,
    Count,
    Custom,
    Flag,
    Kind,
    Named,
    Number,
    Seconds,
    Text,
)
from .reference import tables

__all__ = [
    "MAX_COUNT",
    "MAX_SECONDS",
    "Choice",
    "ConfigError",
    "Count",
    "Custom",
    "Declared",
    "Flag",
    "Key",
    "Kind",
    "Named",
    "Number",
    "Reload",
    "Seconds",
    "Text",
    "add_flags",
    "declared",
    "flag_values",
    "flat",
    "group",
    "merged",
    "names",
    "read",
    "setting",
    "tables",
    "with_values",
]
