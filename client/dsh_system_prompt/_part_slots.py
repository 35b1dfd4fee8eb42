"""A listener stream's parts by slot (docs/protocol.md, "Part slots" and "Tool slots").

The sidecar and this client both hold the stream's base, the parts of the previous
invocation: an invocation names its unchanged parts by their place there, and a reply
names its unchanged parts by their place in its invocation. Parts are held as tuples of
their wire values, so an unchanged part is neither decoded nor encoded again; the
listener sees ordinary objects, made from those tuples when it first reads a field.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import assembly_to_proto
from .errors import protocol_error
from .types import (
    AssembledContext,
    AssembledSection,
    PromptAssembly,
    ToolSchema,
    unconverted,
)

Held = tuple[Any, ...]
"""One part as the sidecar holds it: (name, text), (name, description, parameters_json)
or (name, value)."""

Slotted = Literal["parts", "tools"] | None
"""What a reply names by slot: every part ("part-slots"), tools alone ("tool-slots")."""

KINDS = ("sections", "contexts", "tools", "variables")
_TOOLS = 2
_NOUNS = ("section", "context", "tool", "variable")


def _text(message: pb.AssembledSection | pb.AssembledContext) -> Held:
    return message.name, message.text


def _tool(message: pb.ToolSchema) -> Held:
    return message.name, message.description, message.parameters_json


def _variable(message: pb.Variable) -> Held:
    return message.name, message.value if message.HasField("value") else None


_FROM_WIRE: tuple[Callable[[Any], Held], ...] = (_text, _text, _tool, _variable)
_MAKE: tuple[Callable[[list[Held]], Any], ...] = (
    lambda held: [AssembledSection(*part) for part in held],
    lambda held: [AssembledContext(*part) for part in held],
    lambda held: [ToolSchema.from_json(*part) for part in held],
    dict,
)


def _section_key(section: Any) -> Hashable:
    return section.name, section.text


def _tool_key(tool: Any) -> Hashable:
    # Parameters read as a dict may have changed: only the received text is matched.
    if type(tool) is not ToolSchema:
        return None
    return tool.name, tool.description, tool.parameters_json()


_KEYS: tuple[Callable[[Any], Hashable], ...] = (_section_key, _section_key, _tool_key, tuple)


class Parts:
    """An assembly's parts as the sidecar holds them, one list of `Held` per kind."""

    __slots__ = ("_places", "kinds")

    def __init__(self, kinds: list[list[Held]]) -> None:
        self.kinds = kinds
        self._places: list[dict[Hashable, int] | None] = [None] * len(KINDS)

    @classmethod
    def received(cls, message: pb.PromptAssembly, slots: pb.PartSlots, base: Parts | None) -> Parts:
        """An invocation's parts: `slots` against `base` (the stream's, None before the
        first), the rest from `message`. A bad slot raises PROTOCOL_ERROR."""
        held = base.kinds if base is not None else [[] for _ in KINDS]
        kinds = [
            _resolve(getattr(slots, kind), getattr(message, kind), held[k], k, "an invocation")[0]
            for k, kind in enumerate(KINDS)
        ]
        return cls(kinds)

    def place(self, k: int, key: Hashable) -> int:
        """The slot of an equal part of kind `k`, or -1."""
        places = self._places[k]
        if places is None:
            # Equal parts twice: either slot names the same value.
            places = self._places[k] = dict(zip(self.kinds[k], itertools.count(), strict=False))
        try:
            return places.get(key, -1)
        except TypeError:  # an unhashable value a listener put there: not one of ours
            return -1


class Invocation:
    """One invocation's parts: the views a listener is handed, and its replies by slot."""

    __slots__ = ("_slotted", "parts")

    def __init__(self, parts: Parts, slotted: Slotted) -> None:
        self.parts = parts
        self._slotted = slotted

    def view(self) -> PromptAssembly:
        """The invocation's assembly, each field made when first read."""
        return PromptAssembly._received(_View(self, self.parts.kinds, None))

    def decode(
        self, message: pb.PromptAssembly, slots: pb.PartSlots, tool_slots: Sequence[int]
    ) -> PromptAssembly:
        """What next() returned, its slots read against this invocation whether asked for
        or not (an older sidecar always sent tool slots). A bad slot raises PROTOCOL_ERROR."""
        if slots.tools and tool_slots:
            raise protocol_error("next() came back with both tool_slots and slots.tools")
        originals, places = [], []
        for k, kind in enumerate(KINDS):
            kind_slots = (slots.tools or tool_slots) if k == _TOOLS else getattr(slots, kind)
            held, placed = _resolve(
                kind_slots, getattr(message, kind), self.parts.kinds[k], k, "next()"
            )
            originals.append(held)
            places.append(placed)
        return PromptAssembly._received(_View(self, originals, places))

    def encode(self, assembly: PromptAssembly) -> tuple[pb.PromptAssembly, dict[str, Any]]:
        """`assembly` as a message and the slot fields of the reply that carries it."""
        if self._slotted is None or not isinstance(assembly, PromptAssembly):
            return assembly_to_proto(assembly), {}
        kinds = range(len(KINDS)) if self._slotted == "parts" else (_TOOLS,)
        full = {kind: getattr(assembly, kind) for k, kind in enumerate(KINDS) if k not in kinds}
        slots: dict[str, list[int]] = {}
        for k in kinds:
            slots[KINDS[k]], full[KINDS[k]] = self._slots(assembly, k)
        message = assembly_to_proto(PromptAssembly(**full))
        if self._slotted == "tools":
            return message, {"tool_slots": slots["tools"]}
        return message, {"slots": pb.PartSlots(**slots)}

    def _slots(self, assembly: PromptAssembly, k: int) -> tuple[list[int], Any]:
        """Field `k` of `assembly` as slots into this invocation, and its other parts."""
        view = unconverted(assembly, KINDS[k])
        if isinstance(view, _View) and view.invocation is self:
            return view.unread(k)  # never read: as received, nothing to compare
        value = getattr(assembly, KINDS[k])
        parts = list(value.items()) if isinstance(value, dict) else value
        key, place = _KEYS[k], self.parts.place
        slots = _bounded([place(k, key(part)) for part in parts], len(self.parts.kinds[k]))
        fresh = [part for part, slot in zip(parts, slots, strict=True) if slot < 0]
        return slots, dict(fresh) if isinstance(value, dict) else fresh


class _View:
    """The parts behind a received PromptAssembly: `originals` per kind, and each one's
    slot in the invocation (`placed`; None: they are the invocation's own, in order)."""

    __slots__ = ("invocation", "originals", "placed")

    def __init__(
        self,
        invocation: Invocation,
        originals: list[list[Held]],
        placed: list[list[int]] | None,
    ) -> None:
        self.invocation = invocation
        self.originals = originals
        self.placed = placed

    def convert(self, name: str) -> Any:
        k = KINDS.index(name)
        return _MAKE[k](self.originals[k])

    def unread(self, k: int) -> tuple[list[int], Any]:
        """Kind `k`'s slots in the invocation, and its other parts made."""
        originals = self.originals[k]
        if self.placed is None:
            return list(range(len(originals))), _MAKE[k]([])
        placed = self.placed[k]  # read within the limit, so sent back within it
        return list(placed), _MAKE[k](
            [part for part, slot in zip(originals, placed, strict=True) if slot < 0]
        )


def _bounded(slots: list[int], held: int) -> list[int]:
    """`slots` naming at most `held` parts, the others -1: the sidecar refuses a list
    longer than the parts held and sent (docs/protocol.md, "Part slots": bad slots)."""
    if len(slots) <= held:
        return slots
    named = 0
    for index, slot in enumerate(slots):
        if slot >= 0:
            named += 1
            if named > held:  # a repeat past the bound: this part goes in full
                slots[index] = -1
    return slots


def _resolve(
    slots: Sequence[int], fresh: Sequence[Any], held: list[Held], k: int, where: str
) -> tuple[list[Held], list[int]]:
    """Kind `k`'s parts from slots into `held`, or -1 for the next of `fresh`; and the
    slots (all -1 when none came: every part was sent)."""
    convert = _FROM_WIRE[k]
    if not slots:
        parts = [convert(message) for message in fresh]
        return parts, [-1] * len(parts)
    noun, remaining = _NOUNS[k], iter(fresh)
    parts = []
    for index, slot in enumerate(slots):
        if not -1 <= slot < len(held):
            raise protocol_error(
                f"{where} came with {noun} slot {slot}, but {len(held)} {noun}s were held"
            )
        if index == len(held) + len(fresh):  # as the sidecar bounds replies
            raise protocol_error(
                f"{where} came with {len(slots)} {noun} slots, more than the {len(held)}"
                f" {noun}s held and {len(fresh)} sent"
            )
        message = next(remaining, None) if slot < 0 else None
        if slot < 0 and message is None:
            raise protocol_error(f"{where} came with more -1 {noun} slots than new {noun}s")
        parts.append(held[slot] if slot >= 0 else convert(message))
    if next(remaining, None) is not None:
        raise protocol_error(f"{where} came with more new {noun}s than -1 {noun} slots")
    return parts, list(slots)
