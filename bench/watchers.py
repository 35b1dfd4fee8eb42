"""Watchers in a process of their own: `python -m bench.watchers ADDRESS COUNT [options]`.

Opens COUNT WatchChanges streams and reads every message, doing nothing else, so
that the bench process measures only what the watchers cost the sidecar. Prints
READY once every stream is subscribed.

Idle (the default): batching watchers that drop what they read; runs until killed.

`--plain --burst N --out PATH`: watchers without `change-batches` (grpcurl's, a minimal
client's) that note, for each of the N revisions after their subscription, when they
were told of it: its event read, or a ChangesMissed covering it. Once every watcher was
told of all N, or `--window` seconds after READY, they write those times (ns, the
monotonic clock every process on the host shares; 0 never told) to PATH as N int64 per
watcher, and the revision they subscribed at and the name of each revision seen to
PATH.names (JSON), print DONE and exit.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import time

import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

READY = "watching "
DONE = "done"
BATCHES = "change-batches"  # as the clients ask: pending events come in one message
PER_CHANNEL = 50  # streams per connection, as a few agents' clients would hold (the
# sidecar allows limits.max_watchers_per_peer, 64 by default, per loopback connection)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # channels do not share one


async def _watch(stub: pb_grpc.SystemPromptServiceStub, subscribed: asyncio.Event) -> None:
    call = stub.WatchChanges(pb.WatchChangesRequest(features=[BATCHES]))
    async for _ in call:
        subscribed.set()  # the first message is the subscription; the rest are read and dropped


class _Told:
    """When one plain watcher was told of each revision of the burst."""

    def __init__(self, count: int, names: dict[int, str]) -> None:
        self.at = array.array("q", bytes(8 * count))
        self.base = 0  # the revision it subscribed at: the burst's are base + 1 ... base + count
        self.left = count
        self.done = asyncio.Event()
        self._names = names

    def told(self, first: int, last: int, now: int) -> None:
        for revision in range(max(first, self.base + 1), min(last, self.base + len(self.at)) + 1):
            if not self.at[revision - self.base - 1]:
                self.at[revision - self.base - 1] = now
                self.left -= 1
        if not self.left:
            self.done.set()

    def read(self, message: pb.WatchChangesResponse) -> None:
        now = time.perf_counter_ns()
        kind = message.WhichOneof("kind")
        if kind == "event":
            self._names.setdefault(message.event.revision, message.event.name)
            self.told(message.event.revision, message.event.revision, now)
        elif kind == "missed":
            self.told(message.missed.first_missed_revision, message.missed.resync_revision, now)


async def _watch_plain(
    stub: pb_grpc.SystemPromptServiceStub, told: _Told, subscribed: asyncio.Event
) -> None:
    call = stub.WatchChanges(pb.WatchChangesRequest())
    async for message in call:
        if message.WhichOneof("kind") == "subscribed":
            told.base = message.subscribed.revision
            subscribed.set()
        else:
            told.read(message)
        if told.done.is_set():
            call.cancel()
            return


async def main(args: argparse.Namespace) -> None:
    channels = [
        grpc.aio.insecure_channel(args.address, options=OWN_CONNECTION)
        for _ in range(0, args.count, args.per_channel)
    ]
    stubs = [pb_grpc.SystemPromptServiceStub(channel) for channel in channels]
    subscribed = [asyncio.Event() for _ in range(args.count)]
    if not args.plain:
        tasks = [
            asyncio.create_task(_watch(stubs[i // args.per_channel], subscribed[i]))
            for i in range(args.count)
        ]
        await asyncio.gather(*(event.wait() for event in subscribed))
        print(f"{READY}{args.count}", flush=True)
        await asyncio.gather(*tasks)
        return
    names: dict[int, str] = {}
    told = [_Told(args.burst, names) for _ in range(args.count)]
    tasks = [
        asyncio.create_task(_watch_plain(stubs[i // args.per_channel], told[i], subscribed[i]))
        for i in range(args.count)
    ]
    await asyncio.gather(*(event.wait() for event in subscribed))
    print(f"{READY}{args.count}", flush=True)
    await asyncio.wait(tasks, timeout=args.window)
    _write(args.out, told, names)
    print(DONE, flush=True)
    for task in tasks:
        task.cancel()
    for channel in channels:
        await channel.close(grace=None)


def _write(path: str, told: list[_Told], names: dict[int, str]) -> None:
    with open(path, "wb") as out:
        for one in told:
            one.at.tofile(out)
    with open(f"{path}.names", "w") as out:
        base = told[0].base if told else 0
        json.dump({"base": base, "names": {str(rev): name for rev, name in names.items()}}, out)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.watchers")
    parser.add_argument("address")
    parser.add_argument("count", type=int)
    parser.add_argument("--per-channel", type=int, default=PER_CHANNEL)
    parser.add_argument("--plain", action="store_true", help="without change-batches")
    parser.add_argument("--burst", type=int, default=0, help="revisions to note (--plain)")
    parser.add_argument("--out", default="", help="where the notes go (--plain)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds to note for")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(_arguments()))
