"""JSON text from callers, parsed with a nesting limit (INVALID_JSON past it).

Python's parser recurses once per level: 100,000 levels are a RecursionError,
and a few hundred would still reach clients that parse the text again.
"""

from __future__ import annotations

import json
from typing import Any

from dsh_system_prompt_core import Reason

from ..registry import ServiceError
from .status import bad_request

MAX_JSON_DEPTH = 64
"""Objects and arrays nest at most this deep in assemble fields and tool parameters."""


def load_json(text: str, what: str, constants: bool = True) -> Any:
    """Parse `text`; `what` names it in errors (`assemble fields`); `constants`
    False refuses NaN and Infinity, which are not JSON."""
    try:
        value = json.loads(text) if constants else json.loads(text, parse_constant=_refuse)
    except RecursionError:
        raise _too_deep(what) from None
    except ValueError as error:
        raise bad_request(Reason.INVALID_JSON, f"{what} are not valid JSON: {error}") from None
    # Only text with that many brackets can nest that deep: most skips the walk.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _deeper_than(value):
        raise _too_deep(what)
    return value


def _deeper_than(value: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Level by level, no recursion: is any container more than `limit` levels down?"""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _too_deep(what: str) -> ServiceError:
    message = f"{what} are not valid JSON here: nested deeper than {MAX_JSON_DEPTH} levels"
    return bad_request(Reason.INVALID_JSON, message)


def _refuse(constant: str) -> float:
    raise ValueError(f"{constant} is not JSON")
