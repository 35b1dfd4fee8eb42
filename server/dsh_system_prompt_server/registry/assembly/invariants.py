"""The invariants every returned assembly must satisfy."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from operator import attrgetter

from dsh_system_prompt_core import is_variable_name

from ..errors import invariant
from ..model import Assembly, Part


def validate(assembly: Assembly) -> None:
    """Raise INVARIANT_VIOLATION for the first broken rule (looked for in C; where one is
    broken, found again part by part for its message)."""
    for noun, parts in (("section", assembly.sections), ("context", assembly.contexts)):
        names = list(map(_NAME, parts))
        if "" in names or len(set(names)) != len(names):
            _unique_names(noun, parts)
    if not all(map(_NAME, assembly.tools)):
        raise invariant("assembled tool names must be non-empty")
    if not all(map(_valid_variable_name, assembly.variables)):
        for name in assembly.variables:
            if not is_variable_name(name):
                raise invariant(f'assembled variable name "{name}" is invalid')


_NAME = attrgetter("name")
# The names checked lately: an assembly's variables are mostly the same names every time.
_valid_variable_name = functools.lru_cache(maxsize=1024)(is_variable_name)


def _unique_names(noun: str, parts: Iterable[Part]) -> None:
    seen: set[str] = set()
    for part in parts:
        if not part.name:
            raise invariant(f"assembled {noun} names must be non-empty")
        if part.name in seen:
            raise invariant(f'assembled {noun} name "{part.name}" is duplicated')
        seen.add(part.name)
