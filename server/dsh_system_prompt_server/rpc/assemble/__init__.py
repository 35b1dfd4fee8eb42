"""The Assemble RPC answered: the assembler (reuse, assemble, report, render, encode), the
response cache and its reuse policy, and a dynamic plan's per-part caches.

It may import only what comes before it in `LAYERS` in tests/package/test_package.py.
"""

from .assembler import Assembler, history_key

__all__ = ["Assembler", "history_key"]
