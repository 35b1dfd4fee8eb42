"""Logging set-up: plain text for people, JSON lines for collectors."""

from __future__ import annotations

import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Hashable

from dsh_system_prompt_core import escape_controls

LOGGER_NAME = "dsh_system_prompt"


def configure_logging(level: str, log_format: str) -> None:
    """Send the sidecar's logs to stderr at `level` in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter  # loaded only for JSON logs

        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(OneLine("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


class OneLine(logging.Formatter):
    """The text format, a message's control characters as escapes: a log line is one
    line, whatever a client named or answered (a newline in a provider's error must not
    forge a line of its own, nor an ANSI sequence reach the operator's terminal). The JSON
    format escapes them as JSON does."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.message)
        return super().formatMessage(record)


def logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


class Throttled:
    """Warnings (and errors) at most one per key every `every_s` seconds: the ones held back
    are counted in the next line of their key. At most `keys` keys are remembered (the
    oldest dropped)."""

    def __init__(self, log: logging.Logger, every_s: float = 10.0, keys: int = 1024) -> None:
        self._log = log
        self._every_s = every_s
        self._keys = keys
        self._seen: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()  # last, held

    def warning(self, key: Hashable, message: str, *args: object) -> None:
        self._emit(logging.WARNING, key, message, args)

    def error(
        self, key: Hashable, message: str, *args: object, exc_info: BaseException | None = None
    ) -> None:
        """An error line (with `exc_info`'s traceback), as throttled as warnings are."""
        self._emit(logging.ERROR, key, message, args, exc_info)

    def _emit(
        self,
        level: int,
        key: Hashable,
        message: str,
        args: tuple[object, ...],
        exc_info: BaseException | None = None,
    ) -> None:
        now = time.monotonic()
        last, held = self._seen.get(key, (-self._every_s, 0))
        if now - last < self._every_s:
            self._seen[key] = (last, held + 1)
            return
        self._seen[key] = (now, 0)
        self._seen.move_to_end(key)
        while len(self._seen) > self._keys:
            self._seen.popitem(last=False)
        if held:
            message += f" ({held} more like it held back in {self._every_s:g}s)"
        self._log.log(level, message, *args, exc_info=exc_info)
