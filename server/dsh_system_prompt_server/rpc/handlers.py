"""The service's method handlers, built from its descriptor, with Assemble taking and
answering bytes.

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

from collections.abc import Callable
from typing import Any

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

SERVICE = pb.DESCRIPTOR.services_by_name["SystemPromptService"]
# Methods whose servicer may return (or write) encoded bytes (WatchPrompt: one prompt, encoded
# once, for all the watchers of a scope).
PREENCODED = frozenset({"Assemble", "Listen", "OpenSession", "WatchPrompt"})
# Methods whose servicer (and the policy, guard.access) parses the request itself.
RAW_REQUESTS = frozenset({"Assemble"})


def passthrough(response: Message | bytes) -> bytes:
    """A response already encoded is sent as is; a message is serialized."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def _serializer(method: MethodDescriptor) -> Callable[[Any], bytes]:
    if method.name in PREENCODED:
        return passthrough
    message: type[Message] = getattr(pb, method.output_type.name)
    serialize: Callable[[Any], bytes] = message.SerializeToString
    return serialize


def _handler(servicer: object, method: MethodDescriptor) -> grpc.RpcMethodHandler:
    behaviour = getattr(servicer, method.name)
    request: type[Message] = getattr(pb, method.input_type.name)
    parse = None if method.name in RAW_REQUESTS else request.FromString
    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(method.client_streaming, method.server_streaming)]
    handler: grpc.RpcMethodHandler = kind(
        behaviour,
        request_deserializer=parse,
        response_serializer=_serializer(method),
    )
    return handler


def add_service(servicer: object, server: grpc.aio.Server) -> None:
    """Serve every method of SystemPromptService with `servicer`'s behaviour."""
    handlers = {method.name: _handler(servicer, method) for method in SERVICE.methods}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
