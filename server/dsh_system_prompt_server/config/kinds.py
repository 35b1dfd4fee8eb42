"""What a config key's value may be: its type and bounds, read from TOML, or a `ConfigError`
naming the key and saying what is wrong."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=Enum)
MAX_COUNT = 2**31 - 1  # gRPC takes sizes as C ints; no count needs more
MAX_SECONDS = 86_400.0  # a day: anything longer is a typo, and overflows timers


class ConfigError(Exception):
    """The config cannot be used; the message names the key and what is wrong."""


class Kind(Generic[T]):
    """How one key's value is read, and its bounds as the docs say them."""

    def bounds(self) -> str:
        """What values it takes, for the docs ("" when its type says it all)."""
        return ""

    def read(self, name: str, value: object) -> T:
        raise NotImplementedError


def _refused(name: str, what: str, value: object) -> ConfigError:
    return ConfigError(f"config key '{name}' must be {what}, not {value!r}")


@dataclass(frozen=True)
class Flag(Kind[bool]):
    """true or false."""

    def bounds(self) -> str:
        return "true, false"

    def read(self, name: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise _refused(name, "true or false", value)
        return value


@dataclass(frozen=True)
class Count(Kind[int]):
    """A whole number from `least` (which means `zero`, when said) to `most`."""

    least: int = 1
    most: int = MAX_COUNT
    zero: str = ""

    def bounds(self) -> str:
        zero = f" ({self.zero})" if self.zero else ""
        return f"{self.least}{zero} to {self.most}"

    def read(self, name: str, value: object) -> int:
        # bool is an int in Python; a flag is not a number here.
        if not isinstance(value, int) or isinstance(value, bool):
            raise _refused(name, "a whole number", value)
        if not self.least <= value <= self.most:
            raise _refused(name, f"from {self.bounds()}", value)
        return value


@dataclass(frozen=True)
class Number(Kind[float]):
    """A finite number from `least` to `most`."""

    least: float
    most: float

    def bounds(self) -> str:
        return f"{self.least:g} to {self.most:g}"

    def read(self, name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _refused(name, "a number", value)
        if not math.isfinite(value) or not self.least <= value <= self.most:
            raise _refused(name, f"a number from {self.bounds()}", value)
        return float(value)


@dataclass(frozen=True)
class Seconds(Kind[float]):
    """Seconds, more than 0 up to `most`; with `zero` set, 0 too (meaning `zero`, if not "")."""

    most: float = MAX_SECONDS
    zero: str | None = None

    def bounds(self) -> str:
        if self.zero is None:
            return f"over 0 to {self.most:g} s"
        return f"0{f' ({self.zero})' if self.zero else ''} to {self.most:g} s"

    def read(self, name: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _refused(name, "a number of seconds", value)
        low_ok = value > 0 or (value == 0 and self.zero is not None)
        if not math.isfinite(value) or not low_ok or value > self.most:
            raise _refused(name, f"a number of seconds from {self.bounds()}", value)
        return float(value)


@dataclass(frozen=True)
class Text(Kind[str | None]):
    """Text; "" means absent (None). `check` refuses a value with a ValueError saying why."""

    check: Callable[[str], object] | None = None
    what: str = "text"

    def bounds(self) -> str:
        return self.what

    def read(self, name: str, value: object) -> str | None:
        if not isinstance(value, str):
            raise _refused(name, self.what, value)
        if value and self.check is not None:
            try:
                self.check(value)
            except ValueError as error:
                raise ConfigError(f"config key '{name}': {error}") from None
        return value or None


@dataclass(frozen=True)
class Choice(Kind[str]):
    """One of `options`."""

    options: tuple[str, ...]

    def bounds(self) -> str:
        return ", ".join(f'"{option}"' for option in self.options)

    def read(self, name: str, value: object) -> str:
        if value not in self.options:
            raise _refused(name, f"one of: {', '.join(self.options)}", value)
        assert isinstance(value, str)
        return value


@dataclass(frozen=True)
class Named(Kind[E]):
    """One of an enum's values, read as that enum's member."""

    enum: type[E]

    def bounds(self) -> str:
        return Choice(self._options()).bounds()

    def _options(self) -> tuple[str, ...]:
        return tuple(str(member.value) for member in self.enum)

    def read(self, name: str, value: object) -> E:
        return self.enum(Choice(self._options()).read(name, value))


@dataclass(frozen=True)
class Custom(Kind[T]):
    """A value read by `reader(name, value)`, which raises ConfigError itself."""

    reader: Callable[[str, Any], T]
    shape: str = ""

    def bounds(self) -> str:
        return self.shape

    def read(self, name: str, value: object) -> T:
        return self.reader(name, value)
