"""Logging set-up: plain text for people, JSON lines for collectors."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

LOGGER_NAME = "dsh_system_prompt"


def configure_logging(level: str, log_format: str) -> None:
    """Send the sidecar's logs to stderr at `level` in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{LOGGER_NAME}.{name}")
