"""Every figure's target, in one place: the limit each figure of `make bench` is judged
against, by the figure's key (its words are the figure's own: "≤ 1.3x", "p50 < 50 µs").
A figure only reported has none here."""

from __future__ import annotations

TARGETS: dict[str, float] = {
    # what one assemble costs (figures/assemble.py)
    "in_process": 50.0,  # µs p50, below
    "grpc_assemble": 1.3,  # x the empty unary RPC, p50
    "client_assemble": 1.2,
    "ts_client_assemble": 1.6,
    "go_client_assemble": 1.3,
    # the local cache (figures/local_cache.py): µs, the Python client's cached assemble()
    "local_cache_assemble_p50_us": 50.0,
    "local_cache_assemble_p99_us": 100.0,
    # caches keyed by reach, alice's figures while bob churns (figures/cache_reach.py)
    "cache_reach_provider_calls": 1.0,  # calls of her cacheable provider in 300 assemblies
    "cache_reach_local_answers": 95.0,  # % of her assemblies her local cache answers, at least
    # scale (figures/scale.py)
    "many_scopes": 1.1,
    "report_cost": 1.1,
    "throughput_vs_bare": 0.95,  # at least: assemblies/s / the bare server's with the same bytes
    # dynamic sections and listeners, in bidi round trips (figures/callbacks.py)
    "dynamic_1_session": 1.6,
    "dynamic_5_sessions": 3.5,
    "before_next": 1.6,
    "post_processing": 2.8,
    "further_listener": 1.3,
    "cached_10_providers_1_listener": 1.3,  # x the empty unary RPC, p50
    "cached_10_providers_10_listeners": 1.3,
    # rules, the sidecar's own steps (figures/rules.py): round trips over the static assemble
    "rule_step": 0.2,
    "rules_10": 2.0,
    "rules_10_cached": 1.2,  # x the static assemble with unchanged inputs, p50
    "rule_worst": 2.0,  # x other callers' calm p99, beside the dearest admitted rule
    # watchers and the admin page, slowdowns (figures/watches.py, figures/admin.py)
    "idle_watchers": 3.0,
    "beside_plain_lag_ms": 300.0,  # a batching watcher's p50 beside 900 plain ones, all seen
    "plain_watchers_told_s": 5.0,  # each plain watcher up to date or told it missed, at most
    "prompt_watchers_beside": 1.5,  # x another client's Assemble p50, as issue 34 asks of floods
    "admin_live_views": 2.0,
    # calls without a valid credential, health and reflection, flooding beside a credentialed
    # client (figures/floods.py): its Assemble p50 over its calm one, in the same run
    "flood_no_token": 1.5,
    "flood_wrong_token": 1.5,
    "flood_health": 1.5,
    "flood_reflection": 1.5,
    # memory (figures/memory.py)
    "session_memory": 10.0,  # % RSS growth over 10,000 session cycles, below
    "memo_memory": 1.01,
    # the sidecar tax, each against the floor measured in the same run (figures/tax.py)
    "idle_rss": 1.2,  # x the floor's resident memory, idle
    "start_to_serving": 2.0,  # x the floor's, process start to health SERVING
    "idle_cpu": 0.2,  # % of a core, idle
    "session_memory_kib": 40.0,  # per connected session: 10 static sections, a dynamic one
    "registration_overhead_bytes": 800.0,  # per static registration, over its text
    "image_mib": 140.0,  # the image with everything the `server` extra installs
}
