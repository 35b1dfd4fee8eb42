"""The RPCs answered: the Assemble RPC (`assemble/`), the long-lived streams' brokers (`streams/`),
the state both faces take (`state`: `ServerState`, the composition root, built once and read by
the admin page too) and the servicer (`service`), which only translates and delegates.

It may import only the folders before it in `LAYERS` in tests/package/test_package.py, which
also orders its own sub-folders and modules.
"""

from .service import SystemPromptService
from .settings import ServerLimits, StateSettings, StreamSettings
from .state import ServerState

__all__ = [
    "ServerLimits",
    "ServerState",
    "StateSettings",
    "StreamSettings",
    "SystemPromptService",
]
