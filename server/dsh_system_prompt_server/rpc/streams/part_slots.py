"""Part slots (feature "part-slots"): an assembly's parts named by their place in an
assembly the peer already holds, instead of sent again (docs/protocol.md, "Part slots").

A `Reference` is such an assembly: the stream's base for an invocation (the assembly of
the one before it), or an invocation's assembly for the replies and next results that
belong to it. Parts are matched by value, since an assembly's parts are made anew each
time (registry.assembly.steps), so an unchanged part crosses as a number.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from operator import attrgetter
from typing import TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason
from google.protobuf.message import Message

from ...registry import Assembly, Failure, Part, Status
from ...wire import tool_from_proto

_TEXT_KEY = attrgetter("name", "text")
_TOOL_KEY = attrgetter("name", "description", "parameters_json")

T = TypeVar("T")
M = TypeVar("M", bound=Message)


class Reference:
    """An assembly the client holds, for slots against it both ways."""

    def __init__(self, assembly: Assembly) -> None:
        self.assembly = assembly
        self.variables = list(assembly.variables.items())

    def encode(self, assembly: Assembly, tools_only: bool = False) -> tuple[pb.PartSlots, Assembly]:
        """`assembly` as slots into this one and the assembly of its other (fresh) parts;
        with `tools_only` (feature "tool-slots" alone) every part but the tools goes in full."""
        held = self.assembly
        tool_slots, fresh_tools = _encode(self._tools, assembly.tools, _TOOL_KEY, held.tools)
        if tools_only:
            return pb.PartSlots(tools=tool_slots), dataclasses.replace(assembly, tools=fresh_tools)
        items = list(assembly.variables.items())
        section_slots, fresh_sections = _encode(
            self._sections, assembly.sections, _TEXT_KEY, held.sections
        )
        context_slots, fresh_contexts = _encode(
            self._contexts, assembly.contexts, _TEXT_KEY, held.contexts
        )
        variable_slots, fresh_items = _encode(self._variables, items, tuple, self.variables)
        slots = pb.PartSlots(
            sections=section_slots,
            contexts=context_slots,
            tools=tool_slots,
            variables=variable_slots,
        )
        fresh = dataclasses.replace(
            assembly,
            sections=fresh_sections,
            contexts=fresh_contexts,
            tools=fresh_tools,
            variables=dict(fresh_items),
        )
        return slots, fresh

    def decode(
        self, message: pb.PromptAssembly, slots: pb.PartSlots, tool_slots: Sequence[int]
    ) -> Assembly:
        """The assembly a reply carries, its slots resolved against this one (new tools'
        JSON checked like any registration). A bad slot is a `Failure` naming it."""
        if slots.tools and tool_slots:
            raise _bad("a reply has both tool_slots and slots.tools")
        held = self.assembly
        return Assembly(
            sections=_decode(slots.sections, message.sections, held.sections, _part, "section"),
            contexts=_decode(slots.contexts, message.contexts, held.contexts, _part, "context"),
            tools=_decode(
                slots.tools or tool_slots, message.tools, held.tools, tool_from_proto, "tool"
            ),
            variables=dict(
                _decode(slots.variables, message.variables, self.variables, _item, "variable")
            ),
        )

    def holds(self, assembly: Assembly) -> bool:
        """Whether `assembly` has the very parts of this one, in the same order (equal
        values: a part named by its slot here is as good as the part itself)."""
        held = self.assembly
        return held is assembly or (
            held.sections == assembly.sections
            and held.tools == assembly.tools
            and held.contexts == assembly.contexts
            and held.variables == assembly.variables
        )

    @functools.cached_property
    def every_slot(self) -> pb.PartSlots:
        """This assembly as slots into itself: every part by its place."""
        held = self.assembly
        return pb.PartSlots(
            sections=range(len(held.sections)),
            contexts=range(len(held.contexts)),
            tools=range(len(held.tools)),
            variables=range(len(held.variables)),
        )

    # Each part's place, by value; built when first needed (one kind alone for "tool-slots").
    @functools.cached_property
    def _sections(self) -> dict[Hashable, int]:
        return _index(map(_TEXT_KEY, self.assembly.sections))

    @functools.cached_property
    def _contexts(self) -> dict[Hashable, int]:
        return _index(map(_TEXT_KEY, self.assembly.contexts))

    @functools.cached_property
    def _tools(self) -> dict[Hashable, int]:
        return _index(map(_TOOL_KEY, self.assembly.tools))

    @functools.cached_property
    def _variables(self) -> dict[Hashable, int]:
        return _index(self.variables)


def _index(keys: Iterable[Hashable]) -> dict[Hashable, int]:
    # Equal parts twice: either place names the same value.
    return dict(zip(keys, itertools.count(), strict=False))


def _encode(
    places: dict[Hashable, int],
    parts: Sequence[T],
    key: Callable[[T], Hashable],
    held: Sequence[object],
) -> tuple[list[int], list[T]]:
    slots = [places.get(k, -1) for k in map(key, parts)]
    if len(slots) > len(held):  # a peer refuses more named than held: the rest in full
        named = itertools.accumulate(slot >= 0 for slot in slots)
        slots = [
            slot if count <= len(held) else -1 for slot, count in zip(slots, named, strict=True)
        ]
    return slots, [part for part, slot in zip(parts, slots, strict=True) if slot < 0]


def _decode(
    slots: Sequence[int],
    fresh: Sequence[M],
    held: Sequence[T],
    convert: Callable[[M], T],
    noun: str,
) -> list[T]:
    """Parts from slots: places in `held`, or -1 for the next of `fresh` (converted)."""
    if not slots:
        return [convert(message) for message in fresh]
    slots = list(slots)
    if (  # every slot good (what the loop below checks one by one): resolved at once
        min(slots) >= -1
        and max(slots) < len(held)
        and len(slots) <= len(held) + len(fresh)
        and slots.count(-1) == len(fresh)
    ):
        sent = iter(fresh)
        return [held[slot] if slot >= 0 else convert(next(sent)) for slot in slots]
    parts: list[T] = []
    remaining = iter(fresh)
    for index, slot in enumerate(slots):
        if not -1 <= slot < len(held):
            raise _bad(f"{noun} slot {slot} is out of range ({len(held)} {noun}s held)")
        if index == len(held) + len(fresh):  # so a reply costs no more than what it names
            raise _bad(
                f"more {noun} slots than the {noun}s held and sent ({len(held)} + {len(fresh)})"
            )
        if slot >= 0:
            parts.append(held[slot])
            continue
        message = next(remaining, None)
        if message is None:
            raise _bad(f"more -1 {noun} slots than {noun}s sent")
        parts.append(convert(message))
    if next(remaining, None) is not None:
        raise _bad(f"more {noun}s sent than -1 {noun} slots")
    return parts


def _part(message: pb.AssembledSection | pb.AssembledContext) -> Part:
    return Part(name=message.name, text=message.text)


def _item(message: pb.Variable) -> tuple[str, str | None]:
    return message.name, message.value if message.HasField("value") else None


def _bad(why: str) -> Failure:
    return Failure(Status.INVALID_ARGUMENT, Reason.BAD_TOOL_SLOT, why)
