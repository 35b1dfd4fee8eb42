"""The `dsh-system-prompt` command's entry point: says what to install when the
client-only distribution lacks the sidecar's dependencies (the `server` extra); and the faces'
names loaded on first use (`lazy_names`), so that nothing loads them before it can say so."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

EXIT_USAGE = 2


def main() -> int:
    """Run the CLI, or explain that it needs `dsh-system-prompt[server]`."""
    try:
        from . import cli  # the sidecar's dependencies load here
    except ModuleNotFoundError as error:
        print(
            f"dsh-system-prompt: the command needs the server extra (missing {error.name}):"
            " pip install 'dsh-system-prompt[server]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return cli.main()


def lazy_names(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A face's module `__getattr__` (PEP 562): each name of `modules` imported from its module
    (relative to `package`) on first use."""

    def attribute(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(modules[name], package), name)

    return attribute
