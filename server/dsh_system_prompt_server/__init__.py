"""The dsh-system-prompt sidecar: the registry served over gRPC.

A folder per room, each saying in its `__init__` what belongs there; their order, in which a
folder imports only those before it, is `LAYERS` in tests/package/test_package.py
(docs/architecture.md has one line per folder).

This module is the package's face, what tests, the bench and embedders import: the config, the
sidecar and how to start it, the registry. Its names load on first use, so that the
`dsh-system-prompt` command can say the `server` extra is missing (`sidecar/launcher.py`) before
any of the sidecar's dependencies are imported.
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
