"""The Assemble RPC answered: the assembler (reuse, assemble, report, render, encode), the
response cache and its reuse policy, and a dynamic plan's per-part caches.

Imports `registry/`, `reports/`, `telemetry/` and `wire/`; imported by the state and the
servicer.
"""

from .assembler import Assembler, history_key

__all__ = ["Assembler", "history_key"]
