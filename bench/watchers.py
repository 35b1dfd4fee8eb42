"""Idle watchers in a process of their own: `python -m bench.watchers ADDRESS COUNT`.

Opens COUNT WatchChanges streams and reads every event, doing nothing else, so
that the bench process measures only what the watchers cost the sidecar.
Prints READY once every stream is subscribed; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

READY = "watching "
BATCHES = "change-batches"  # as the clients ask: pending events come in one message
PER_CHANNEL = 50  # streams per connection, as a few agents' clients would hold (the
# sidecar allows limits.max_watchers_per_peer, 64 by default, per loopback connection)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # channels do not share one


async def _watch(stub: pb_grpc.SystemPromptServiceStub, subscribed: asyncio.Event) -> None:
    call = stub.WatchChanges(pb.WatchChangesRequest(features=[BATCHES]))
    async for _ in call:
        subscribed.set()  # the first message is the subscription; the rest are read and dropped


async def main(address: str, count: int) -> None:
    channels = [
        grpc.aio.insecure_channel(address, options=OWN_CONNECTION)
        for _ in range(0, count, PER_CHANNEL)
    ]
    stubs = [pb_grpc.SystemPromptServiceStub(channel) for channel in channels]
    subscribed = [asyncio.Event() for _ in range(count)]
    tasks = [
        asyncio.create_task(_watch(stubs[i // PER_CHANNEL], subscribed[i])) for i in range(count)
    ]
    await asyncio.gather(*(event.wait() for event in subscribed))
    print(f"{READY}{count}", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
