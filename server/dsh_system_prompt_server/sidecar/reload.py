"""Config reload: on SIGHUP or a changed config file, apply what can change live.

The new file is validated whole first; a bad one changes nothing and is
logged. Settings that only take effect at start (addresses, TLS, auth, the
transport's limits) keep their running value, and a log line says a restart
is needed for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, Key, Reload, declared, flat, merged
from ..telemetry import LOGGER_NAME, logger
from .app import Sidecar
from .config import POLL_S, SidecarConfig, all_credentials, auth_enabled

_log = logger("reload")


@dataclass(frozen=True)
class Reloaded:
    """What one reload did: the keys applied live, and those that wait for a restart."""

    applied: list[str]
    need_restart: list[str]


def apply(sidecar: Sidecar, new: SidecarConfig, loaded: SidecarConfig) -> Reloaded:
    """Apply `new`'s live settings to `sidecar`; `loaded` is the config read last time.

    Each key's declaration says when it applies (`Reload`): a live one now, a restart one
    never (its running value stays), one of the credentials' while some credential stays
    configured before and after (the check is bound into the server)."""
    auth_live = sidecar.authenticator is not None and auth_enabled(new)

    def takes(key: Key) -> bool:
        return key.reload is Reload.LIVE or (key.reload is Reload.WITH_AUTH and auth_live)

    live = merged(sidecar.config, new, takes)
    if auth_live:
        assert sidecar.authenticator is not None
        sidecar.authenticator.update(all_credentials(live))  # token files read again, too
    sidecar.config = live
    sidecar.registry.reconfigure(live.registry)
    sidecar.state.reconfigure(live.state)
    logging.getLogger(LOGGER_NAME).setLevel(live.log_level.upper())
    before, after = flat(loaded), flat(new)
    changed = [entry for entry in declared(type(new)) if after[entry.name] != before[entry.name]]
    return Reloaded(
        applied=[entry.name for entry in changed if takes(entry.key)],
        need_restart=[entry.name for entry in changed if not takes(entry.key)],
    )


class Reloader:
    """Reloads `path` into a running sidecar, on demand and when the file changes.

    The poller applies new contents only once two polls in a row read the same
    bytes: a file being rewritten in place (`>` truncates first) is never applied
    half written or empty. SIGHUP applies at once: the operator says it is done.
    """

    def __init__(self, sidecar: Sidecar, path: str, load: Callable[[], SidecarConfig]) -> None:
        self._sidecar = sidecar
        self._path = path
        self._load = load
        self._loaded = sidecar.config
        self._seen = _fingerprint(path)
        # New contents seen once (a digest, or None: unreadable), applied if seen again.
        self._pending: tuple[str | None] | None = None

    def reload(self, why: str) -> Reloaded | None:
        """Load, validate and apply the file; None (and an error logged) when it is bad."""
        self._seen = before = _fingerprint(self._path)
        try:
            new = self._load()
        except ConfigError as error:
            self._failed(why, str(error))
            return None
        if _fingerprint(self._path) != before:  # rewritten while being read: the next poll
            self._seen = None
            _log.warning("config file %s changed while being read: not applied", self._path)
            return None
        try:
            reloaded = apply(self._sidecar, new, self._loaded)
        except Exception as error:  # a bug, but the running sidecar must go on serving
            _log.exception("config reload from %s (%s) failed while applying", self._path, why)
            self._failed(why, f"{type(error).__name__}: {error}")
            return None
        self._loaded = new
        changed = ", ".join(reloaded.applied) or "nothing changed"
        _log.info("config reloaded from %s (%s): %s", self._path, why, changed)
        for key in reloaded.need_restart:
            _log.warning(
                "config key '%s' changed in %s but takes effect only at a restart:"
                " the running value stays",
                key,
                self._path,
            )
        return reloaded

    def _failed(self, why: str, error: str) -> None:
        _log.error(
            "config reload from %s (%s) failed, keeping the running config: %s",
            self._path,
            why,
            error,
        )

    def poll(self) -> Reloaded | None:
        """One look at the file: reload when it changed and reads the same as last look."""
        current = _fingerprint(self._path)
        if current == self._seen:
            self._pending = None
            return None
        if self._pending != (current,):
            self._pending = (current,)  # maybe mid-write: wait for it to read the same again
            return None
        self._pending = None
        return self.reload("config file changed")

    async def watch(self, interval: float = POLL_S) -> None:
        """Reload whenever the file's contents change (a mounted ConfigMap swaps it)."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.poll()
            except Exception:  # the poller outlives any one bad look at the file
                _log.exception("config poll of %s failed; polling on", self._path)


def _fingerprint(path: str) -> str | None:
    """The file's contents' digest; None while it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except (OSError, ValueError):
        return None
