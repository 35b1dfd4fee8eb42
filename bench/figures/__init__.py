"""One function per figure of the issue, in modules by family; each returns the figures
it measured, built by `build` (one helper and the shapes over it). `ALL` names them in
the order `python -m bench` runs them.

Every comparison is measured side by side in the same run, interleaved (see
`stats.interleaved`), and the figure is the ratio; absolute times are details.
The sidecars run in child processes (`procs`); the bench process is the client,
and it also hosts the client-side callables (dynamic providers, listeners).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..report import Figure
from .admin import admin_live_views
from .assemble import (
    client_assemble,
    go_client_assemble,
    grpc_assemble,
    in_process,
    ts_client_assemble,
)
from .cache_reach import cache_reach
from .callbacks import cached_callbacks, dynamic_sections, listeners
from .floods import floods_beside
from .harness import Budget, Harness, collect_garbage
from .local_cache import local_cache_assemble, local_cache_staleness, ts_local_cache_assemble
from .memory import memo_memory, session_memory
from .rules import rule_worst, rules, rules_memory
from .scale import many_scopes, report_cost, throughput, unix_vs_tcp
from .tax import tax
from .tool_order import tool_order_churn
from .watches import (
    beside_plain_watchers,
    change_fan_out,
    idle_watchers,
    prompt_watchers_beside,
)

FigureFn = Callable[[Harness], Awaitable[list[Figure]]]

ALL: dict[str, FigureFn] = {
    "in_process": in_process,
    "grpc_assemble": grpc_assemble,
    "client_assemble": client_assemble,
    "ts_client_assemble": ts_client_assemble,
    "go_client_assemble": go_client_assemble,
    "local_cache_assemble": local_cache_assemble,
    "ts_local_cache_assemble": ts_local_cache_assemble,
    "local_cache_staleness": local_cache_staleness,
    "cache_reach": cache_reach,
    "many_scopes": many_scopes,
    "report_cost": report_cost,
    "tool_order_churn": tool_order_churn,
    "dynamic_sections": dynamic_sections,
    "listeners": listeners,
    "cached_callbacks": cached_callbacks,
    "rules": rules,
    "rule_worst": rule_worst,
    "rules_memory": rules_memory,
    "throughput_vs_bare": throughput,
    "unix_vs_tcp": unix_vs_tcp,
    "change_fan_out": change_fan_out,
    "idle_watchers": idle_watchers,
    "beside_plain_watchers": beside_plain_watchers,
    "prompt_watchers_beside": prompt_watchers_beside,
    "session_memory": session_memory,
    "memo_memory": memo_memory,
    "admin_live_views": admin_live_views,
    "floods": floods_beside,
    "tax": tax,
}


__all__ = ["ALL", "Budget", "FigureFn", "Harness", "collect_garbage"]
