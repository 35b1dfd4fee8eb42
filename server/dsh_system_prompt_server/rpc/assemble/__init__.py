"""The Assemble RPC answered: the assembler (reuse, assemble, report, render, encode), the
response cache and its reuse policy, and a dynamic plan's per-part caches.

Imports the registry, reports, telemetry and `rpc`'s translation modules; imported by the state.
"""
