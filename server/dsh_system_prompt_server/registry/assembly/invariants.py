"""The invariants every returned assembly must satisfy."""

from __future__ import annotations

from collections.abc import Iterable

from dsh_system_prompt_core import is_variable_name

from ..errors import invariant
from ..model import Assembly, Part


def validate(assembly: Assembly) -> None:
    """Raise INVARIANT_VIOLATION for the first broken rule."""
    _unique_names("section", assembly.sections)
    _unique_names("context", assembly.contexts)
    if any(not tool.name for tool in assembly.tools):
        raise invariant("assembled tool names must be non-empty")
    for name in assembly.variables:
        if not is_variable_name(name):
            raise invariant(f'assembled variable name "{name}" is invalid')


def _unique_names(noun: str, parts: Iterable[Part]) -> None:
    seen: set[str] = set()
    for part in parts:
        if not part.name:
            raise invariant(f"assembled {noun} names must be non-empty")
        if part.name in seen:
            raise invariant(f'assembled {noun} name "{part.name}" is duplicated')
        seen.add(part.name)
