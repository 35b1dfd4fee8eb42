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
    # watchers and the admin page, slowdowns (figures/watches.py, figures/admin.py)
    "idle_watchers": 3.0,
    "admin_live_views": 2.0,
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
