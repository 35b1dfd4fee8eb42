"""The service's method handlers, built from its descriptor, with every request and stream
message parsed here (bytes that are no message: INVALID_ARGUMENT INVALID_VALUE, not gRPC's
UNKNOWN) and Assemble taking and answering bytes; and the one way a call is intercepted:
every method of every service the server serves (this one, health, reflection) wrapped,
once, when the server is built, by the sidecar's ordered list of `Interception`s.

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

import inspect
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from ..registry import LIMIT_KEYS, Failure, Limits, too_large
from ..telemetry import Throttled, logger
from .status import abort, bad_request, set_status

Context: TypeAlias = "grpc.aio.ServicerContext[object, object]"
Behaviour: TypeAlias = Callable[[Any, Context], Coroutine[Any, Any, Any]]

SERVICE = pb.DESCRIPTOR.services_by_name["SystemPromptService"]
_SERVICE_PREFIX = f"/{SERVICE.full_name}/"
# Methods whose servicer may return (or write) encoded bytes (WatchPrompt: one prompt, encoded
# once, for all the watchers of a scope).
PREENCODED = frozenset({"Assemble", "Listen", "OpenSession", "WatchPrompt"})
# Methods whose servicer parses the request itself (`assemble_request`); every other
# request is parsed by the `parsing` interception (`parsed`), and the policy parses what it
# reads.
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
            f"assemble request (its context's fields_json at most {LIMIT_KEYS.max_fields_bytes},"
            f" its scope and report key at most {LIMIT_KEYS.max_name_bytes})",
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


class Method(NamedTuple):
    """One RPC as an interception sees it, once, when the server's handlers are built."""

    path: str  # "/dsh.systemprompt.v1.SystemPromptService/Assemble"
    client_streaming: bool
    server_streaming: bool

    @property
    def name(self) -> str:
        """Its short name (`Assemble`)."""
        return self.path.rpartition("/")[2]

    @property
    def ours(self) -> bool:
        """Whether it is SystemPromptService's (not health's or reflection's)."""
        return self.path.startswith(_SERVICE_PREFIX)


class Interception(NamedTuple):
    """One way every call is wrapped: `around(method, behaviour)` is asked once per method
    and gives the behaviour its calls run (`behaviour` itself where it does not apply)."""

    name: str
    around: Callable[[Method, Behaviour], Behaviour]


class Registrar(Protocol):
    """What the generated `add_..._to_server` functions call on a server."""

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None: ...

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None: ...


class Intercepted:
    """A server as the generated `add_..._to_server` functions see it: every method added is
    served by `server` wrapped in `interceptions`, the first outermost.

    gRPC's own server interceptors run per call: each is awaited and each builds the method's
    handler again. Every interception here decides by the method alone, so it is asked once
    per method; a call then runs only the behaviours they return."""

    def __init__(self, server: Registrar, interceptions: Sequence[Interception]) -> None:
        self._server = server
        self.interceptions = tuple(interceptions)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        """Nothing: the generated code adds the same methods as registered handlers next."""

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        wrapped = {
            name: self._intercepted(f"/{service}/{name}", handler)
            for name, handler in handlers.items()
        }
        generic = grpc.method_handlers_generic_handler(service, wrapped)
        self._server.add_generic_rpc_handlers((generic,))
        self._server.add_registered_method_handlers(service, wrapped)

    def _intercepted(self, path: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kind = (handler.request_streaming, handler.response_streaming)
        method = Method(path, *kind)
        behaviour = _awaitable(method, getattr(handler, _BEHAVIOURS[kind]))
        for interception in reversed(self.interceptions):
            behaviour = interception.around(method, behaviour)
        made: grpc.RpcMethodHandler = _MAKERS[kind](
            behaviour,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        return made


def _awaitable(method: Method, behaviour: Callable[..., Any]) -> Behaviour:
    """`behaviour` as a coroutine function, which every interception awaits: a response
    generator's responses written through the call's context (the reader/writer API), a
    plain function called on the loop, as gRPC calls one without a thread pool (health's
    List, not implemented)."""
    if inspect.iscoroutinefunction(behaviour):
        return behaviour
    if inspect.isasyncgenfunction(behaviour):

        async def written(request: Any, context: Context) -> None:
            async for response in behaviour(request, context):
                await context.write(response)

        return written
    if method.server_streaming or inspect.isgeneratorfunction(behaviour):
        raise TypeError(f"{method.path}: a stream served by {behaviour!r}, not async")

    async def called(request: Any, context: Context) -> Any:
        return behaviour(request, context)

    return called


# (request streaming, response streaming): the handler's behaviour, and how one is made
_BEHAVIOURS = {
    (False, False): "unary_unary",
    (False, True): "unary_stream",
    (True, False): "stream_unary",
    (True, True): "stream_stream",
}
_MAKERS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def ending(method: Method, behaviour: Behaviour) -> Behaviour:
    """The `status` interception: a Failure that ends a call is its status. A unary call's
    is set on its context, and the call returns: raised, gRPC's abort keeps the call's state
    (its RPCState, context and a dozen frames) in a reference cycle with the exception until
    a full garbage collection, and a flood's refused calls made those 50-95 ms long. A
    stream's is raised. Any other exception is a bug of the sidecar's: logged with its
    traceback (once per method and kind each 10 s), then raised, and gRPC ends the call
    UNKNOWN, as before, when the operator saw nothing of it."""
    unary = not (method.client_streaming or method.server_streaming)
    bugs = Throttled(logger("rpc"), every_s=10.0)

    async def ended(request: Any, context: Context) -> Any:
        try:
            return await behaviour(request, context)
        except Failure as error:
            if not unary:
                await abort(context, error)
            set_status(context, error)
            return None
        except grpc.aio.AbortError:
            raise  # a status the call set itself (health's, reflection's)
        except Exception as error:
            message = "%s failed on a bug, %s: %s; the call ends UNKNOWN"
            kind = type(error).__name__
            bugs.error(kind, message, method.name, kind, error, exc_info=error)
            raise

    return ended


def parsing(method: Method, behaviour: Behaviour) -> Behaviour:
    """The `parsing` interception: a SystemPromptService method's request, or each message
    its client streams, parsed from the call's bytes (Assemble's: by the servicer)."""
    if not method.ours or method.name in RAW_REQUESTS:
        return behaviour
    if method.client_streaming:
        return _reading(behaviour, method.name)
    return _parsing(behaviour, method.name)


def _parsing(behaviour: Behaviour, method: str) -> Behaviour:
    """`behaviour`, given its request parsed from the call's bytes, or the call refused."""

    async def parse_then(data: bytes | Message, context: Context) -> Any:
        if isinstance(data, Message):  # the policy parsed it already (guard.auth)
            return await behaviour(data, context)
        return await behaviour(parsed(method, data), context)  # a Failure: `ending`'s

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


def add_service(servicer: object, server: Registrar) -> None:
    """Serve every method of SystemPromptService with `servicer`'s behaviour, its requests
    as bytes (parsed by the `parsing` interception, so a bad one gets the service's status)."""
    handlers = {
        method.name: _MAKERS[(method.client_streaming, method.server_streaming)](
            getattr(servicer, method.name),
            request_deserializer=None,
            response_serializer=_serializer(method),
        )
        for method in SERVICE.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
