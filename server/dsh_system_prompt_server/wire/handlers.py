"""The service's method handlers, built from its descriptor, with every request and stream
message parsed here (bytes that are no message: INVALID_ARGUMENT INVALID_VALUE, not gRPC's
UNKNOWN) and Assemble taking and answering bytes.

The generated `add_..._to_server` serializes every response message; Assemble's
responses are encoded by the service itself (cached ones once, for every caller),
and so are a listener stream's invocations, so their serializers write `bytes` as
they are. Assemble's requests reach the service as the bytes that came: a repeated
one is answered from them, unparsed, and one larger than the limits allow is refused by
its size alone (issue 22: a refused 4 MB request cost every other caller its parse, and
grpcio has no per-method receive limit: the server's one must stay max_message_bytes
for listeners' answers and registrations).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from ..registry import Failure, Limits, too_large
from .status import abort, bad_request

Context: TypeAlias = "grpc.aio.ServicerContext[object, object]"
Behaviour: TypeAlias = Callable[[Any, Context], Coroutine[Any, Any, Any]]

SERVICE = pb.DESCRIPTOR.services_by_name["SystemPromptService"]
# Methods whose servicer may return (or write) encoded bytes (WatchPrompt: one prompt, encoded
# once, for all the watchers of a scope).
PREENCODED = frozenset({"Assemble", "Listen", "OpenSession", "WatchPrompt"})
# Methods whose servicer parses the request itself (`assemble_request`); every other
# unary request is parsed by its handler (`parsed`), and the policy parses what it reads.
RAW_REQUESTS = frozenset({"Assemble"})
# An AssembleRequest's tags, lengths and flags around its fields_json and names.
_ASSEMBLE_FRAMING_BYTES = 64


def parsed(method: str, data: bytes) -> Message:
    """`data` parsed as the request of `method` (its short name: `RegisterSection`)."""
    message: type[Message] = getattr(pb, SERVICE.methods_by_name[method].input_type.name)
    try:
        return message.FromString(data)
    except DecodeError:
        article = "an" if message.__name__[0] in "AEIOU" else "a"
        raise bad_request(
            Reason.INVALID_VALUE,
            f"the request's bytes are not {article} {message.__name__} message",
        ) from None


def check_assemble_size(data: bytes, limits: Limits) -> None:
    """Refuse an Assemble request by its size alone, before its bytes are hashed or parsed:
    only its fields_json (`limits.max_fields_bytes`), scope and report key
    (`limits.max_name_bytes`) can make it large."""
    limit = limits.max_fields_bytes + 2 * limits.max_name_bytes + _ASSEMBLE_FRAMING_BYTES
    if len(data) > limit:
        raise too_large(
            "assemble request (its context's fields_json at most limits.max_fields_bytes, its"
            " scope and report key at most limits.max_name_bytes)",
            len(data),
            limit,
        )


def assemble_request(data: bytes) -> pb.AssembleRequest:
    """An Assemble request's bytes parsed (their size checked before: `check_assemble_size`)."""
    request = parsed("Assemble", data)
    assert isinstance(request, pb.AssembleRequest)
    return request


def request_of(method: str, data: bytes, limits: Limits) -> Message | None:
    """The request a unary call's bytes hold, for a reader before the servicer (the policy);
    None when the servicer will refuse them (too large, or no message)."""
    try:
        if method in RAW_REQUESTS:
            check_assemble_size(data, limits)
            return assemble_request(data)
        return parsed(method, data)
    except Failure:
        return None


def passthrough(response: Message | bytes) -> bytes:
    """A response already encoded is sent as is; a message is serialized."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def _serializer(method: MethodDescriptor) -> Callable[[Any], bytes]:
    if method.name in PREENCODED:
        return passthrough
    message: type[Message] = getattr(pb, method.output_type.name)
    serialize: Callable[[Any], bytes] = message.SerializeToString
    return serialize


def _parsing(behaviour: Behaviour, method: str) -> Behaviour:
    """`behaviour`, given its request parsed from the call's bytes, or the call refused."""

    async def parse_then(data: bytes | Message, context: Context) -> Any:
        if isinstance(data, Message):  # the policy parsed it already (guard.auth)
            return await behaviour(data, context)
        try:
            request = parsed(method, data)
        except Failure as error:
            await abort(context, error)
        return await behaviour(request, context)

    return parse_then


class ContextAround:
    """A call's context with some of its methods changed by a subclass (its reads, its
    writes); everything else is the context's."""

    def __init__(self, context: Context) -> None:
        self._context = context

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class _ParsingStream(ContextAround):
    """A stream's context whose reads parse the peer's bytes as `method`'s messages (a Failure,
    INVALID_VALUE, for bytes that are none)."""

    def __init__(self, context: Context, method: str) -> None:
        super().__init__(context)
        self._method = method

    async def read(self) -> Any:
        data = await self._context.read()
        return data if data is grpc.aio.EOF else parsed(self._method, data)


def _reading(behaviour: Behaviour, method: str) -> Behaviour:
    """A client-streaming `behaviour` (the reader/writer API), its messages parsed as read."""

    async def read_then(requests: Any, context: Context) -> Any:
        return await behaviour(requests, _ParsingStream(context, method))

    return read_then


def _handler(
    servicer: object, method: MethodDescriptor, around: Callable[[Behaviour], Behaviour]
) -> grpc.RpcMethodHandler:
    behaviour = getattr(servicer, method.name)
    if method.client_streaming:
        behaviour = _reading(behaviour, method.name)
    elif method.name not in RAW_REQUESTS:
        behaviour = _parsing(behaviour, method.name)
    behaviour = around(behaviour)
    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(method.client_streaming, method.server_streaming)]
    handler: grpc.RpcMethodHandler = kind(
        behaviour,
        request_deserializer=None,  # bytes: parsed above, so a bad one gets our status
        response_serializer=_serializer(method),
    )
    return handler


def add_service(
    servicer: object,
    server: grpc.aio.Server,
    around: Callable[[Behaviour], Behaviour] = lambda behaviour: behaviour,
) -> None:
    """Serve every method of SystemPromptService with `servicer`'s behaviour, each call
    (its parse included) run by `around` (the clients' shares of the loop)."""
    handlers = {method.name: _handler(servicer, method, around) for method in SERVICE.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
