"""How text a peer chose (a name, a message) is shown on a terminal or in a log line."""

from __future__ import annotations

import unicodedata

# Controls, format characters (bidi overrides among them) and line/paragraph separators:
# what would break the line or reach the terminal as a command rather than as text.
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def escape_controls(text: str) -> str:
    """`text` with each control character as its repr escape (`\\n`, `\\x1b`, `\\u202e`);
    printable text (non-ASCII too) as is: for text a peer chose (a name, a message), which
    must not reach the terminal as commands nor break the line it is shown on."""
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) in _CONTROL_CATEGORIES else c for c in text
    )
