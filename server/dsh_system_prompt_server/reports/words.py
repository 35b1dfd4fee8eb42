"""A report's reason as it is written: its text, and where in it each listener or rule is
named, with the layer it is held in.

Two steps of one kind and name may be held in different layers, one a reader is shown by
name and one it is not: a reason's text alone cannot tell which of them it names, so each
place that names a step keeps which step it is (`Named`), and shown.py rewrites only the
places that name a step hidden from the reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from ..registry import Origin


class Named(NamedTuple):
    """A place in a reason that names a listener or rule: its `describe()` starts at `at`."""

    at: int
    origin: Origin


@dataclass(frozen=True, slots=True)
class Words:
    """Text, with the listeners and rules it names and where."""

    text: str = ""
    steps: tuple[Named, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.text)


Piece = str | Origin | Words


def said(*pieces: Piece) -> Words:
    """`pieces` one after the other: an origin by its `describe()`, kept with its place when
    it is a listener or rule."""
    texts: list[str] = []
    steps: list[Named] = []
    at = 0
    for piece in pieces:
        if isinstance(piece, Origin):
            piece = Words(piece.describe(), (Named(0, piece),) if piece.step else ())
        elif isinstance(piece, str):
            piece = Words(piece)
        texts.append(piece.text)
        steps += [Named(at + named.at, named.origin) for named in piece.steps]
        at += len(piece.text)
    return Words("".join(texts), tuple(steps))


def joined(separator: str, pieces: Iterable[Words]) -> Words:
    """`pieces` with `separator` between each two."""
    between: list[Piece] = []
    for piece in pieces:
        between += [separator, piece] if between else [piece]
    return said(*between)
