"""Write docs/operations.md's tables of config keys from the keys' declarations.

Each table stands between `<!-- config keys: TABLE -->` and `<!-- end of config keys -->`
(TABLE is `top level`, `limits`, `fair_share`); everything else in the file is left as it is.

Usage: python scripts/config_docs.py [--check]   (--check: exit 1 when a table is stale)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dsh_system_prompt_server import SidecarConfig
from dsh_system_prompt_server.config import tables

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
TOP_LEVEL = "top level"
BLOCK = re.compile(r"(<!-- config keys: (.+?) -->\n).*?(<!-- end of config keys -->)", re.S)


def render(text: str) -> str:
    """`text` with each marked table made again from the declarations."""
    made = {table or TOP_LEVEL: rows for table, rows in tables(SidecarConfig).items()}
    placed = {match.group(2) for match in BLOCK.finditer(text)}
    if placed != set(made):
        raise SystemExit(f"{OPERATIONS.name}: tables marked {sorted(placed)}, made {sorted(made)}")
    return BLOCK.sub(lambda m: f"{m.group(1)}{made[m.group(2)]}\n{m.group(3)}", text)


def main() -> int:
    text = OPERATIONS.read_text(encoding="utf-8")
    fresh = render(text)
    if "--check" in sys.argv[1:]:
        if fresh != text:
            print("docs/operations.md: config tables are stale (run `make docs`)")
            return 1
        print("config tables are fresh")
        return 0
    OPERATIONS.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
