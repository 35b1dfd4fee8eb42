"""A flood of calls that carry no valid credential, in a process of its own (issue 34, item 5):

    python -m bench.floods ADDRESS KIND

KIND is one of `FLOODS`: Assembles without a token (`no_token`) or with a wrong one
(`wrong_token`), each the request an honest client sends; health checks (`health`); server
reflection's list of services (`reflection`, one stream a call, as grpcurl opens). Every
call goes out again as soon as it is answered, `IN_FLIGHT` at a time on each of
`CONNECTIONS` connections of its own. Prints READY once the first answers came back, then
floods until killed, so the bench process measures only what the flood costs the sidecar's
other callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

READY = "flooding "
CONNECTIONS = 4
IN_FLIGHT = 16  # calls in flight on each connection
SCOPE = "honest"  # the scope the honest client assembles: the flood asks for the same
WRONG = (("authorization", "Bearer not-a-token-the-sidecar-knows"),)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # channels do not share one
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
# grpc_reflection's messages, as grpcurl's `list` sends and reads them: only their bytes matter
LIST_SERVICES = b"\x3a\x00"  # ServerReflectionRequest{list_services: ""}

Call = Callable[[], Awaitable[object]]


def _call(channel: grpc.aio.Channel, kind: str) -> Call:
    """One call of the flood `kind` on `channel`."""
    if kind in ("no_token", "wrong_token"):
        stub = pb_grpc.SystemPromptServiceStub(channel)
        request = pb.AssembleRequest(context=pb.AssembleContext(scope=SCOPE), render=True)
        metadata = WRONG if kind == "wrong_token" else None
        return lambda: stub.Assemble(request, metadata=metadata)
    if kind == "health":
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest()
        return lambda: health.Check(check)
    if kind == "reflection":
        info = channel.stream_stream(REFLECTION)

        async def listed() -> object:
            call = info()
            await call.write(LIST_SERVICES)
            await call.done_writing()
            return [message async for message in call]

        return listed
    raise SystemExit(f"unknown flood {kind!r}: one of {', '.join(FLOODS)}")


FLOODS = ("no_token", "wrong_token", "health", "reflection")


async def _lane(call: Call, answered: asyncio.Event) -> None:
    while True:
        with contextlib.suppress(grpc.aio.AioRpcError):  # refused: what most of these are
            await call()
        answered.set()


async def main(address: str, kind: str) -> None:
    channels = [
        grpc.aio.insecure_channel(address, options=OWN_CONNECTION) for _ in range(CONNECTIONS)
    ]
    calls = [_call(channel, kind) for channel in channels]
    answered = asyncio.Event()
    lanes = [asyncio.create_task(_lane(call, answered)) for call in calls for _ in range(IN_FLIGHT)]
    await answered.wait()
    print(f"{READY}{kind}", flush=True)
    await asyncio.gather(*lanes)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
