"""A listener stream's big messages encoded by joining bytes, never built as messages.

An invocation and a next() result carry a whole assembly. Its encoding is joined from
the cached encodings of its parts (`encoding.assembly_encoding`), and the rest of the
message is small: encoded on its own and joined on, the assembly is neither parsed into
a message nor serialized again, and gRPC writes the bytes as they are (`handlers`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ...registry import Assembly, Tool
from ..encoding import assembly_encoding, delimited

_RESPONSE = pb.ListenResponse.DESCRIPTOR.fields_by_name
_INVOCATION, _NEXT_RESULT = (_RESPONSE[name].number for name in ("invocation", "next_result"))
_INVOCATION_ASSEMBLY = pb.ListenerInvocation.DESCRIPTOR.fields_by_name["assembly"].number
_NEXT_ASSEMBLY = pb.ListenerNextResult.DESCRIPTOR.fields_by_name["assembly"].number


def invocation(head: pb.ListenerInvocation, assembly: Assembly) -> bytes:
    """A ListenResponse with `head` (id, context, trace context) and `assembly`."""
    body = head.SerializeToString() + delimited(_INVOCATION_ASSEMBLY, assembly_encoding(assembly))
    return delimited(_INVOCATION, body)


def next_result(invocation_id: int, returned: Assembly, sent: Sequence[Tool] | None) -> bytes:
    """A ListenResponse with what next() returned; with `sent` (what the client holds, for a
    client that reads slots) its tools among them go as slots."""
    slots: list[int] = []
    if sent is not None:
        index = {id(tool): position for position, tool in enumerate(sent)}
        slots = [index.get(id(tool), -1) for tool in returned.tools]
        fresh = [tool for tool, slot in zip(returned.tools, slots, strict=True) if slot < 0]
        returned = dataclasses.replace(returned, tools=fresh)
    head = pb.ListenerNextResult(invocation_id=invocation_id, tool_slots=slots)
    body = head.SerializeToString() + delimited(_NEXT_ASSEMBLY, assembly_encoding(returned))
    return delimited(_NEXT_RESULT, body)
