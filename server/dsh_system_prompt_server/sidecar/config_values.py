"""The config file's value readers: a key's type, range or file, or a ConfigError naming it."""

from __future__ import annotations

import math
import ssl
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
MAX_COUNT = 2**31 - 1  # gRPC takes sizes as C ints; no count needs more
MAX_SECONDS = 86_400.0  # a day: anything longer is a typo, and overflows timers


class ConfigError(Exception):
    """The config cannot be used; the message names the key and what is wrong."""


def check_token(key: str, path: str) -> str:
    data = read_file(key, path)
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"config key '{key}': {path} is not UTF-8 text") from None
    if not token:
        raise ConfigError(f"config key '{key}': {path} is empty")
    return token


def check_pem(key: str, path: str, load: Callable[[ssl.SSLContext], None]) -> None:
    read_file(key, path)
    try:
        load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    except (ssl.SSLError, ValueError) as error:
        what = "private key for tls_cert_file" if key == "tls_key_file" else "PEM certificate"
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


def count(raw: dict[str, Any], key: str, default: int, prefix: str = "") -> int:
    value = typed(raw, key, int, default, prefix)
    if not 1 <= value <= MAX_COUNT:
        raise ConfigError(f"config key '{prefix}{key}' must be from 1 to {MAX_COUNT}, not {value}")
    return value


def optional_path(raw: dict[str, Any], key: str) -> str | None:
    value = typed(raw, key, str, "")
    return value or None


def typed(raw: dict[str, Any], key: str, kind: type[T], default: T, prefix: str = "") -> T:
    value = raw.get(key, default)
    # bool is an int in Python; a flag is not a number here, nor the reverse.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ConfigError(f"config key '{prefix}{key}' must be a {kind.__name__}, not {value!r}")
    return value


def seconds(raw: dict[str, Any], key: str, default: float, allow_zero: bool = False) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config key '{key}' must be a number of seconds, not {value!r}")
    if (
        not math.isfinite(value)
        or value < 0
        or (value == 0 and not allow_zero)
        or (value > MAX_SECONDS)
    ):
        bound = "from 0" if allow_zero else "greater than 0 and"
        raise ConfigError(
            f"config key '{key}' must be a number of seconds {bound} up to {MAX_SECONDS:g},"
            f" not {value!r}"
        )
    return float(value)
