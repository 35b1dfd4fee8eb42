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

from typing import TYPE_CHECKING

from .sidecar import lazy_names

if TYPE_CHECKING:
    from .registry import Registry, RegistrySettings
    from .sidecar import (
        ConfigError,
        Sidecar,
        SidecarConfig,
        load_config,
        parse_config,
        start_sidecar,
    )

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
# The face's names by the folder whose face holds them; each is imported on first use.
_FACES = {
    ".registry": ("Registry", "RegistrySettings"),
    ".sidecar": (
        "ConfigError",
        "Sidecar",
        "SidecarConfig",
        "load_config",
        "parse_config",
        "start_sidecar",
    ),
}
__getattr__ = lazy_names(__name__, {name: face for face, names in _FACES.items() for name in names})
