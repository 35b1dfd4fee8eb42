"""A listener stream's big messages encoded by joining bytes, never built as messages.

An invocation and a next() result carry a whole assembly. Its encoding is joined from
the cached encodings of its parts (`encoding.assembly_encoding`), and the rest of the
message is small: encoded on its own and joined on, the assembly is neither parsed into
a message nor serialized again, and gRPC writes the bytes as they are (`handlers`).
"""

from __future__ import annotations

from collections.abc import Sequence

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ...registry import Assembly
from ...wire import assembly_encoding, delimited

_RESPONSE = pb.ListenResponse.DESCRIPTOR.fields_by_name
_INVOCATION, _NEXT_RESULT = (_RESPONSE[name].number for name in ("invocation", "next_result"))
_INVOCATION_ASSEMBLY = pb.ListenerInvocation.DESCRIPTOR.fields_by_name["assembly"].number
_NEXT_ASSEMBLY = pb.ListenerNextResult.DESCRIPTOR.fields_by_name["assembly"].number

NextSlots = pb.PartSlots | Sequence[int] | None


def invocation(head: pb.ListenerInvocation, assembly: Assembly) -> bytes:
    """A ListenResponse with `head` (id, context, trace context) and `assembly`."""
    body = head.SerializeToString() + delimited(_INVOCATION_ASSEMBLY, assembly_encoding(assembly))
    return delimited(_INVOCATION, body)


def next_result(invocation_id: int, returned: Assembly, slots: NextSlots = None) -> bytes:
    """A ListenResponse with what next() returned: `returned` holds the parts not named
    by `slots` (PartSlots for "part-slots", tool slots alone for "tool-slots")."""
    head = pb.ListenerNextResult(invocation_id=invocation_id)
    if isinstance(slots, pb.PartSlots):
        head.slots.CopyFrom(slots)
    elif slots is not None:
        head.tool_slots.extend(slots)
    body = head.SerializeToString() + delimited(_NEXT_ASSEMBLY, assembly_encoding(returned))
    return delimited(_NEXT_RESULT, body)
