"""A plan's per-part caches: each part's field encoding and interpolated text, kept by
position with the part they were made from, so a dynamic plan's response is joined from
the kept ones of the parts that did not change and fresh ones of those that did.

A kept value is reused only for an equal part (and, for a text, equal variables):
parts are immutable values, so an equal part encodes and renders the same. The
caches live on the plan (`Plan.part_caches`), which a change replaces; what they
hold is one assembly's parts, since each call keeps only its own. The joins themselves
are not kept (a copy of the whole prompt per scope: 300 scopes of a 3.5 MiB prompt were
+1 GiB), and all plans' caches together stay within a byte budget (`PartBudget`).
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import is_not
from typing import Generic, TypeVar

from dsh_system_prompt_core import CONTEXT_SNAPSHOT_HEADER, SECTION_SEPARATOR, interpolate

from ...registry import Assembly, Part, Plan, Tool
from ...wire import (
    Pieces,
    context_field,
    held_bytes,
    rendered_pieces,
    section_field,
    tool_field,
    variable_field,
)

T = TypeVar("T")
M = TypeVar("M")  # what a part is made into: its field, or its text
Variables = Mapping[str, str | None]


def _part_bytes(part: object, kept: object) -> int:
    """What one kept position holds: the part with its strings, and what was made from it
    (a text that is the part's own text is counted once)."""
    made = 0 if kept is getattr(part, "text", None) else sys.getsizeof(kept)
    return held_bytes(part) + made


class _Kept(Generic[T, M]):
    """One list of an assembly's parts as last made into fields or texts: the parts, what
    was made of each, and what each position holds in memory (counted when it was made)."""

    __slots__ = ("_made", "_parts", "_sizes", "size")

    def __init__(self) -> None:
        self._parts: list[T] = []
        self._made: list[M] = []
        self._sizes: list[int] = []
        self.size = sys.getsizeof(self)  # what it keeps alive, in bytes

    def _remade(
        self, parts: Sequence[T], make: Callable[[T], M], anew: bool = False
    ) -> tuple[list[M], list[int]]:
        """What `parts` make: by position, the kept one of each unchanged part (found in
        C, by identity first: most are the very parts of the last assembly) and fresh ones;
        all fresh with `anew`."""
        olds = self._parts
        if anew or len(parts) != len(olds):  # a step added or removed parts: positions moved
            made = [make(part) for part in parts]
            return made, list(map(_part_bytes, parts, made))
        made, sizes = list(self._made), list(self._sizes)
        for index in itertools.compress(range(len(parts)), map(is_not, parts, olds)):
            part = parts[index]
            if part != olds[index]:
                made[index] = make(part)
                sizes[index] = _part_bytes(part, made[index])
        return made, sizes

    def _keep(self, parts: Sequence[T], made: list[M], sizes: list[int]) -> None:
        self._parts, self._made, self._sizes = list(parts), made, sizes
        self.size = sum(map(sys.getsizeof, (self, self._parts, made)), sum(sizes))


class _Fields(_Kept[T, bytes]):
    """One list of an assembly's parts as last encoded: the parts and their fields, and the
    fields' length together."""

    __slots__ = ("length",)

    def __init__(self) -> None:
        super().__init__()
        self.length = 0

    def fields(self, parts: Sequence[T], encode: Callable[[T], bytes]) -> list[bytes]:
        """The parts' fields: the kept field of each unchanged part (by position) and
        fresh ones."""
        if parts != self._parts:  # compared in C, by identity first
            self._keep(parts, *self._remade(parts, encode))
            self.length = sum(map(len, self._made))
        return self._made


class _Texts(_Kept[Part, str]):
    """One list of parts as last interpolated, under the variables it was done with."""

    __slots__ = ("_head", "_noun", "_variables")

    def __init__(self, noun: str, head: str = "") -> None:
        super().__init__()
        self._noun = noun
        self._head = head
        self._variables: dict[str, str | None] | None = None

    def encoded(self, parts: Sequence[Part], variables: Variables) -> bytes:
        """The UTF-8 encoding of render_prompt's join of the interpolated, non-empty texts,
        after the head and a separator when there is a head and a text (RenderFailure as
        render_prompt). Encoded from the join, not kept: the texts kept are mostly the parts'
        own strings, which take no memory of their own."""
        anew = variables != self._variables
        if anew or parts != self._parts:
            made, sizes = self._remade(parts, lambda part: self._text(part, variables), anew)
            # kept only once every part rendered: a failure leaves the last good ones
            self._keep(parts, made, sizes)
            self._variables = dict(variables)
            strings = itertools.chain.from_iterable(self._variables.items())
            held = (self._noun, self._variables, *strings)
            self.size += sum(map(sys.getsizeof, held))
        body = SECTION_SEPARATOR.join(filter(None, self._made))
        if self._head and body:
            return f"{self._head}{SECTION_SEPARATOR}{body}".encode()
        return body.encode()

    def _text(self, part: Part, variables: Variables) -> str:
        return interpolate(part.text, variables, f'{self._noun} "{part.name}"')


@dataclass(slots=True)
class PartCaches:
    """One plan's encodings and renderings of its assemblies' parts, by kind."""

    sections: _Fields[Part] = field(default_factory=_Fields)
    contexts: _Fields[Part] = field(default_factory=_Fields)
    tools: _Fields[Tool] = field(default_factory=_Fields)
    variables: _Fields[tuple[str, str | None]] = field(default_factory=_Fields)
    prompt: _Texts = field(default_factory=lambda: _Texts("section"))
    snapshot: _Texts = field(default_factory=lambda: _Texts("context", CONTEXT_SNAPSHOT_HEADER))

    @property
    def size(self) -> int:
        """What the kept fields and texts take in memory, with the parts and variables they
        keep alive: each position counted when its part was encoded or rendered and kept
        with it (an object kept by two positions or two kinds, or shared with other plans,
        is counted in each: a little more than is held, never less). The fields alone were
        counted: a plan kept twice that, and ten times with one emoji in a provider's text
        (its str takes 4 bytes a character). Counting every object of the kinds that
        changed at each response took most of what a rule's step cost (0.14 ms of 0.68)."""
        kinds = (self.sections, self.contexts, self.tools, self.variables)
        return sys.getsizeof(self) + sum(kind.size for kind in (*kinds, self.prompt, self.snapshot))

    def payload(self, assembly: Assembly) -> Pieces:
        """assembly_encoding(assembly) in pieces, the kept fields of its unchanged parts."""
        kinds = (self.sections, self.contexts, self.tools, self.variables)
        pieces = self.sections.fields(assembly.sections, section_field)
        pieces = [*pieces, *self.contexts.fields(assembly.contexts, context_field)]
        pieces += self.tools.fields(assembly.tools, tool_field)
        pieces += self.variables.fields(list(assembly.variables.items()), variable_field)
        return Pieces(pieces, sum(kind.length for kind in kinds))

    def rendered(self, assembly: Assembly) -> Pieces:
        """The encoding of the RenderedPrompt of render_prompt(assembly) and
        render_context_snapshot(assembly), in pieces: from the kept texts of the unchanged
        parts (RenderFailure as those)."""
        variables = assembly.variables
        prompt = self.prompt.encoded(assembly.sections, variables)
        snapshot = self.snapshot.encoded(assembly.contexts, variables)
        return rendered_pieces(prompt, snapshot)

    def clear(self) -> None:
        """Forget every kept field and text (a plan still holding these starts again)."""
        self.sections, self.contexts = _Fields(), _Fields()
        self.tools, self.variables = _Fields(), _Fields()
        self.prompt, self.snapshot = _Texts("section"), _Texts("context", CONTEXT_SNAPSHOT_HEADER)


class PartBudget:
    """Every live plan's part caches together, at most `max_bytes`: past it, the least
    recently used plan's are emptied (its next response encodes its parts again). A plan's
    caches go with the plan: a change makes a new one, and no response can reach the old
    one's (a soak's churn kept 1,400 dead plans' caches, 60,000 parts that every full
    garbage collection walked, while the bytes stayed under the budget)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes  # a reload may change it; it applies from the next use
        self.bytes = 0
        # by id, with a weak reference to the plan whose end forgets them: a kept
        # PartCaches is held here, so its id is not reused while it is kept
        self._kept: OrderedDict[int, tuple[PartCaches, int, weakref.ref[Plan]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[PartCaches]:
        """The plans' caches kept now."""
        return (caches for caches, _, _ in self._kept.values())

    def of(self, plan: Plan) -> PartCaches:
        """The plan's caches, made at its first response."""
        caches = plan.part_caches
        if not isinstance(caches, PartCaches):
            caches = plan.part_caches = PartCaches()
        return caches

    def used(self, plan: Plan) -> None:
        """Count `plan`'s caches as they are now, most recently used; empty others past the
        budget."""
        caches = self.of(plan)
        key = id(caches)
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept[1]
        size = caches.size
        if size > self.max_bytes:
            caches.clear()  # larger than the whole budget: encoded again each time
            return
        alive = kept[2] if kept is not None else weakref.ref(plan, lambda _: self._forget(key))
        self._kept[key] = (caches, size, alive)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (oldest, oldest_size, _) = self._kept.popitem(last=False)
            oldest.clear()
            self.bytes -= oldest_size

    def _forget(self, key: int) -> None:
        """The plan of the caches kept under `key` has ended: they go with it."""
        kept = self._kept.pop(key, None)
        if kept is not None:
            self.bytes -= kept[1]
