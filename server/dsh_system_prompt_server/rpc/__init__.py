"""The RPCs answered: the Assemble RPC (`assemble/`), the long-lived streams' brokers
(`streams/`), the state both faces take (`state`: built once, read by the admin page too) and
the servicer (`service`), which only translates and delegates.

It may import `registry/`, `reports/`, `telemetry/`, `wire/` and `guard/`; `admin/` and
`sidecar/` import it. Inside, lowest first: `assemble/`, `streams/`, `state`, `service`; each
imports only those before it.
"""

from .service import SystemPromptService
from .state import ServerState, StateSettings
from .streams import OutboxLimits, WatchSettings

__all__ = ["OutboxLimits", "ServerState", "StateSettings", "SystemPromptService", "WatchSettings"]
