"""The long-lived streams and their brokers: sessions, listeners, watches, live prompts.

Belongs here: a stream's life cycle (open, first-message check, outbox, reader and writer,
ending, stalls), the hosts the registry calls through a stream (a session's providers, a
listener), change and prompt watches, and what bounds a peer (outbox, turns, in-flight bytes;
sessions and watches counted per client with the registry's `ClientCounts`). It may import
only what comes before it in `LAYERS` in tests/package/test_package.py.
"""

from .listeners import Listeners
from .outbox import OutboxLimits
from .sessions import Session, Sessions
from .watches import Watches, WatchSettings

__all__ = ["Listeners", "OutboxLimits", "Session", "Sessions", "WatchSettings", "Watches"]
