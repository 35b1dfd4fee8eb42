"""The process: its config, the server built from it, reloads, and the command line.

Belongs here: the config file's keys and checks, listening, building and stopping the gRPC
server (with health, reflection, metrics and the admin page), SIGHUP and file-poll reloads, and
the `dsh-system-prompt` commands. It is the top of `LAYERS` in tests/package/test_package.py: it
may import every other folder, and none imports it but the package's face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .launcher import lazy_names, main

if TYPE_CHECKING:
    from ..config import ConfigError
    from .app import Sidecar, start_sidecar
    from .config import SidecarConfig, load_config, parse_config

__all__ = [
    "ConfigError",
    "Sidecar",
    "SidecarConfig",
    "lazy_names",
    "load_config",
    "main",
    "parse_config",
    "start_sidecar",
]
# The rest load on first use: the command starts in `launcher`, which must say the `server`
# extra is missing before any of the sidecar's dependencies load.
__getattr__ = lazy_names(
    __name__,
    {
        "Sidecar": ".app",
        "start_sidecar": ".app",
        "ConfigError": "..config",
        "SidecarConfig": ".config",
        "load_config": ".config",
        "parse_config": ".config",
    },
)
