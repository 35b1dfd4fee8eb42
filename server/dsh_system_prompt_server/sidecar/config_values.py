"""What the credentials' tables and the security keys' files are checked with: a file's
token or PEM, a table's keys and types, or a ConfigError naming the key."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any, TypeVar

from ..config import ConfigError

T = TypeVar("T")


def check_token(key: str, path: str) -> str:
    data = read_file(key, path)
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"config key '{key}': {path} is not UTF-8 text") from None
    if not token:
        raise ConfigError(f"config key '{key}': {path} is empty")
    return token


def check_pem(
    key: str, path: str, load: Callable[[ssl.SSLContext], None], what: str = "PEM certificate"
) -> None:
    read_file(key, path)
    try:
        load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    except (ssl.SSLError, ValueError) as error:
        raise ConfigError(f"config key '{key}': {path} is not a {what} ({error})") from None


def read_file(key: str, path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ConfigError(f"config key '{key}': cannot read {path}: {error.strerror}") from None
    except ValueError:  # a NUL in the path: no file can have that name
        raise ConfigError(f"config key '{key}': {path!r} is not a file name") from None


def no_unknown(table: dict[str, Any], known: set[str], prefix: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}'")


def typed(raw: dict[str, Any], key: str, kind: type[T], default: T, prefix: str = "") -> T:
    value = raw.get(key, default)
    # bool is an int in Python; a flag is not a number here, nor the reverse.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"config key '{prefix}{key}' must be a {kind.__name__}, not {value!r}")
    return value
