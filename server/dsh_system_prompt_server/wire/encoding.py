"""The assembly's wire encodings: PromptAssembly and AssembleResponse joined from
cached encodings of the immutable parts and tools, not built message by message."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import NamedTuple

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from google.protobuf.message import Message

from ..registry import Assembly, Part, Tool


def assembly_to_proto(assembly: Assembly) -> pb.PromptAssembly:
    """The assembly as a message, from cached encodings of its immutable parts and tools.

    Parts and tools repeat from one assembly to the next, so each is encoded
    once; the message is then parsed from their concatenation (a message's
    encoding is the concatenation of its fields' encodings).
    """
    return pb.PromptAssembly.FromString(assembly_encoding(assembly))


def assembly_encoding(assembly: Assembly) -> bytes:
    """The assembly's PromptAssembly encoding, joined from its parts' cached encodings."""
    encoded = [
        *map(section_field, assembly.sections),
        *map(context_field, assembly.contexts),
        *map(tool_field, assembly.tools),
        *map(variable_field, assembly.variables.items()),
    ]
    return b"".join(encoded)


_RESPONSE = pb.AssembleResponse.DESCRIPTOR.fields_by_name
_RESPONSE_ASSEMBLY, _RESPONSE_RENDERED, _RESPONSE_REPORT, _RESPONSE_SKIPPED = (
    _RESPONSE[name].number for name in ("assembly", "rendered", "report", "skipped")
)
_RESPONSE_REVISION_KEY = _RESPONSE["revision"].number << 3  # a varint field
_RESPONSE_CACHEABLE_KEY = _RESPONSE["cacheable"].number << 3  # a varint (bool) field
_RESPONSE_CACHE_REVISION_KEY = _RESPONSE["cache_revision"].number << 3  # a varint field
_RESPONSE_SCOPE_CHAIN_KEY = _RESPONSE["scope_chain"].number << 3 | 2  # length-delimited
_RESPONSE_BY_FIELDS_KEY = _RESPONSE["cacheable_with_fields"].number << 3  # a varint (bool)
# the keys (and a true bool's whole field), encoded once: they are the same in every response
_REVISION_KEY, _CACHE_REVISION_KEY, _SCOPE_CHAIN_KEY = (
    bytes((key,))
    for key in (_RESPONSE_REVISION_KEY, _RESPONSE_CACHE_REVISION_KEY, _RESPONSE_SCOPE_CHAIN_KEY)
)
_CACHEABLE_TRUE, _BY_FIELDS_TRUE = (
    bytes((key, 1)) for key in (_RESPONSE_CACHEABLE_KEY, _RESPONSE_BY_FIELDS_KEY)
)
_ASSEMBLY_KEY, _RENDERED_KEY = (
    bytes((number << 3 | 2,)) for number in (_RESPONSE_ASSEMBLY, _RESPONSE_RENDERED)
)


class Pieces(NamedTuple):
    """An encoding in pieces, to be joined into a larger one, and its length."""

    pieces: list[bytes]
    length: int


def assemble_response(
    assembly: Assembly,
    revision: int,
    rendered: pb.RenderedPrompt | Pieces | None = None,
    report: pb.AssemblyReport | None = None,
    cacheable: bool = False,
    payload: Pieces | None = None,
    skipped: Sequence[pb.SkippedStep] = (),
    cache_revision: int = 0,
    scope_chain: Sequence[str] = (),
    cacheable_with_fields: bool = False,
) -> bytes:
    """An AssembleResponse's encoding, written directly and joined once: no message is
    built for the assembly, and gRPC sends the bytes as they are (handlers.passthrough).
    `payload` is the assembly's encoding in pieces when the caller has them (part_caches),
    `rendered` the RenderedPrompt or its encoding in pieces. `cache_revision` and
    `scope_chain` say what a client keeps the answer under (revisions.py);
    `cacheable_with_fields` that it may keep it by the fields too (a rules-only plan)."""
    if payload is None:
        encoded = assembly_encoding(assembly)
        payload = Pieces([encoded], len(encoded))
    out = [_ASSEMBLY_KEY, _varint(payload.length)]
    out += payload.pieces
    if isinstance(rendered, Pieces):
        out += (_RENDERED_KEY, _varint(rendered.length))
        out += rendered.pieces
    elif rendered is not None:
        out.append(_field(_RESPONSE_RENDERED, rendered))
    if revision:
        out += (_REVISION_KEY, _varint(revision))
    if report is not None:
        out.append(_field(_RESPONSE_REPORT, report))
    if cacheable:
        out.append(_CACHEABLE_TRUE)
    out += [_field(_RESPONSE_SKIPPED, step) for step in skipped]
    if cache_revision:
        out += (_CACHE_REVISION_KEY, _varint(cache_revision))
    for key in scope_chain:
        encoded = key.encode()
        out += (_SCOPE_CHAIN_KEY, _varint(len(encoded)), encoded)
    if cacheable_with_fields:
        out.append(_BY_FIELDS_TRUE)
    return b"".join(out)  # the response's one copy of the pieces


_RENDERED = pb.RenderedPrompt.DESCRIPTOR.fields_by_name
_PROMPT_KEY, _SNAPSHOT_KEY = (
    bytes((_RENDERED[name].number << 3 | 2,)) for name in ("prompt", "context_snapshot")
)


def rendered_pieces(prompt: bytes, snapshot: bytes) -> Pieces:
    """A RenderedPrompt's encoding in pieces, from its two strings' UTF-8 encodings (an
    empty string is left out, as the message's encoding leaves it)."""
    out: list[bytes] = []
    for key, string in ((_PROMPT_KEY, prompt), (_SNAPSHOT_KEY, snapshot)):
        if string:
            out += (key, _varint(len(string)), string)
    return Pieces(out, sum(map(len, out)))


_SECTIONS, _CONTEXTS, _TOOLS, _VARIABLES = (
    pb.PromptAssembly.DESCRIPTOR.fields_by_name[name].number
    for name in ("sections", "contexts", "tools", "variables")
)


def held_objects(value: object) -> tuple[object, ...]:
    """The objects a kept part, tool or variable (name, value) holds: itself and its strings."""
    if isinstance(value, Part):
        return (value, value.name, value.text)
    if isinstance(value, Tool):
        return (value, value.name, value.description, value.parameters_json)
    if isinstance(value, tuple):
        return (value, *value)
    return (value,)


def held_bytes(value: object) -> int:
    """The memory `value` holds (a str takes up to 4 bytes a character: one emoji in a text
    makes every character 4, so its encoding's length is no measure of it)."""
    return sum(map(sys.getsizeof, held_objects(value)))


class _Encodings:
    """Encoded fields of immutable parts, tools and variables by value, at most `max_bytes`
    together (each counted with the value it is kept by), least recently used dropped first.
    It was 16,384 entries whatever their size: a cacheable provider answering 250 KiB for
    each distinct context kept every answer it gave, encoded (400 answers: sidecar RSS
    +234 MiB)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: OrderedDict[tuple[int, Hashable], tuple[bytes, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def kept(self) -> Iterator[tuple[Hashable, bytes]]:
        """Each value kept now, with its encoding."""
        return ((value, encoded) for (_, value), (encoded, _) in self._kept.items())

    def field(self, number: int, value: Hashable, message: Callable[[], Message]) -> bytes:
        """`value`'s field `number`, encoded from `message()` unless it is kept."""
        key = (number, value)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept[0]
        encoded = _field(number, message())
        # the encoding and the value (it was counted as long as the encoding: a text with
        # one emoji in it holds four times that)
        size = sys.getsizeof(encoded) + held_bytes(value)
        if size <= self.max_bytes:
            self._kept[key] = encoded, size
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, oldest) = self._kept.popitem(last=False)
                self.bytes -= oldest
        return encoded


ENCODINGS = _Encodings(max_bytes=32 * 1024 * 1024)


def section_field(part: Part) -> bytes:
    return ENCODINGS.field(
        _SECTIONS, part, lambda: pb.AssembledSection(name=part.name, text=part.text)
    )


def context_field(part: Part) -> bytes:
    return ENCODINGS.field(
        _CONTEXTS, part, lambda: pb.AssembledContext(name=part.name, text=part.text)
    )


def tool_field(tool: Tool) -> bytes:
    return ENCODINGS.field(_TOOLS, tool, lambda: tool_to_proto(tool))


def variable_field(item: tuple[str, str | None]) -> bytes:
    name, value = item

    def variable() -> pb.Variable:
        return pb.Variable(name=name) if value is None else pb.Variable(name=name, value=value)

    return ENCODINGS.field(_VARIABLES, item, variable)


def _field(number: int, message: Message) -> bytes:
    """`message` encoded as length-delimited field `number`: key, length, bytes."""
    return delimited(number, message.SerializeToString())


def delimited(number: int, payload: bytes) -> bytes:
    """`payload` (a message's encoding) as length-delimited field `number`."""
    return b"".join((_varint(number << 3 | 2), _varint(len(payload)), payload))  # one copy


_SMALL = [bytes((value,)) for value in range(0x80)]  # a varint of one byte, made once


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tool_to_proto(tool: Tool) -> pb.ToolSchema:
    return pb.ToolSchema(
        name=tool.name, description=tool.description, parameters_json=tool.parameters_json
    )
