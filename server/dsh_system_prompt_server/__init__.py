"""The dsh-system-prompt sidecar: the registry served over gRPC.

Its folders, lowest first; a folder imports only the ones above it in this list:

- `registry/`: the spec's semantics in plain Python (layers, shadowing, ordering, assembly);
- `reports/`: prompt-cache awareness in plain Python (reports, blame, diff, history, tokens);
- `telemetry/`: metrics, logs and traces;
- `wire/`: the gRPC wire without state (messages, statuses, method handlers, addresses);
- `guard/`: who may call, and when (credentials, roles, fair shares, the drain gate);
- `rpc/`: the RPCs answered (the Assemble RPC, the streams' brokers, the state, the
  servicer);
- `admin/`: the read-only admin page;
- `sidecar/`: the process (config, building the server, reloads, the command line).

This module is the package's face, what tests, the bench and embedders import: the config,
the sidecar and how to start it, the registry. Its names load on first use, so that the
`dsh-system-prompt` command can say the `server` extra is missing (`sidecar/launcher.py`)
before any of the sidecar's dependencies are imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .registry import Registry, RegistrySettings
    from .sidecar.app import Sidecar, start_sidecar
    from .sidecar.config import SidecarConfig, load_config, parse_config
    from .sidecar.config_values import ConfigError

# Each name of the face and the module that defines it.
_FACE = {
    "Registry": ".registry",
    "RegistrySettings": ".registry",
    "Sidecar": ".sidecar.app",
    "start_sidecar": ".sidecar.app",
    "ConfigError": ".sidecar.config_values",
    "SidecarConfig": ".sidecar.config",
    "load_config": ".sidecar.config",
    "parse_config": ".sidecar.config",
}

__all__ = [
    "ConfigError",
    "Registry",
    "RegistrySettings",
    "Sidecar",
    "SidecarConfig",
    "load_config",
    "parse_config",
    "start_sidecar",
]


def __getattr__(name: str) -> Any:
    """A name of the face, imported from its module on first use."""
    if name not in _FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_FACE[name], __name__), name)
