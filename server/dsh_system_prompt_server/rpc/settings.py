"""The served state's part of the sidecar config: its config keys, declared with their values.

`StateSettings` is what `ServerState` is built from and a reload hands it again; each
component's own settings are made from it there (`rpc/state.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Count, Reload, Seconds, group, setting
from ..guard import ShareSettings
from ..registry import quota_limit
from ..reports import ReportSettings


@dataclass(frozen=True)
class ServerLimits:
    """Limits of the transport and of the sidecar as a whole: config table [limits]."""

    max_message_bytes: int = setting(
        4 * 1024 * 1024,
        Count(),
        "RESOURCE_EXHAUSTED: gRPC's own size check on what arrives, whole before it can be"
        " refused (Memory budget); an assembly too large to send fails `RESPONSE_TOO_LARGE`",
        reload=Reload.RESTART,
    )
    max_sessions: int = quota_limit(1_000)
    max_sessions_per_peer: int = quota_limit(
        100,
        "sessions one client may hold, however many connections it opens, headroom for others"
        " (Quotas per client)",
    )
    max_watchers: int = quota_limit(1_000, "change and prompt watches together")
    max_watchers_per_peer: int = quota_limit(64, "change and prompt watches one client may hold")
    max_outbox_bytes: int = setting(
        8 * 1024 * 1024,
        Count(),
        "messages queued for one session or listener stream, past which further invocations"
        " and provide requests wait for its reads within their assembly's time (for streams"
        " opened from then on; a peer is closed only for not reading, Memory budget); also"
        " the prompt messages in flight to one client's `WatchPrompt` streams, and four"
        " times it to all",
    )
    max_response_cache_bytes: int = setting(
        32 * 1024 * 1024,
        Count(),
        "never refused: encoded Assemble responses kept for reuse with the request bytes that"
        " index them, and as much again for the parts' encodings and renderings; the least"
        " recently used evicted first",
    )
    max_report_history_bytes: int = setting(
        64 * 1024 * 1024,
        Count(),
        "never refused: prompt-cache report history in bytes of memory, as Python holds it;"
        " the least recently reported keys evicted first",
    )
    max_connections: int = setting(
        4096,
        Count(),
        "connections open at once on the gRPC port; one more is closed as it arrives",
        reload=Reload.RESTART,
    )


@dataclass(frozen=True)
class StreamSettings:
    """How change and prompt watches buffer and batch."""

    watch_buffer: int = setting(
        1024,
        Count(),
        "change events a watcher may have unsent; past it, it is told it missed every unsent"
        " one (`ChangesMissed`)",
    )
    watch_lag_s: float = setting(
        2.0,
        Seconds(zero="no bound"),
        "a change watcher without `change-batches` whose oldest unsent event has waited this"
        " long is told it missed every unsent event (`ChangesMissed`) and reads on from the"
        " latest",
    )
    prompt_coalesce_s: float = setting(
        0.1,
        Seconds(zero=""),
        "a prompt watcher (`WatchPrompt`) waits this long after a change to gather the burst,"
        " then sends one prompt",
    )
    prompt_bytes_per_s: int = setting(
        16 * 1024 * 1024,
        Count(least=0, zero="no bound"),
        "prompt bytes the sidecar writes per second to every prompt watcher (`WatchPrompt`)"
        " together, clients in turn; a watcher that waits for its turn sends the latest"
        " prompt then, with every change since its last",
    )
    watch_coalesce_s: float = setting(
        0.005,
        Seconds(most=1.0, zero=""),  # a delay on every change event of every watcher
        "a change watcher that takes batches (`change-batches`) waits this long after a"
        " change to gather the burst, then sends it in one message",
    )


@dataclass(frozen=True)
class StateSettings:
    """The served state's config; a reload hands it again (`ServerState.reconfigure`)."""

    limits: ServerLimits = group(ServerLimits, "limits")
    streams: StreamSettings = group(StreamSettings)
    reports: ReportSettings = group(ReportSettings)
    fair_share: ShareSettings = group(ShareSettings, "fair_share")
