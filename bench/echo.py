"""A bare bidi echo server, the baseline for "one bidi round trip of an empty message".

The sidecar has no echo RPC, so the baseline is this generic grpc.aio handler:
bytes in, the same bytes out, no protobuf, no servicer logic. It runs in its own
process, like the sidecar, so that a round trip crosses processes as a listener
or provider round trip does. Run as `python -m bench.echo --listen 127.0.0.1:0`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

SERVICE = "bench.Echo"
METHOD = f"/{SERVICE}/Echo"
READY = "echo listening on "


async def _echo(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


async def serve(listen: str) -> None:
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(_echo)  # no (de)serializers: bytes
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler}),)
    )
    await serve_until_stopped(server, listen, READY)


async def serve_until_stopped(
    server: grpc.aio.Server,
    listen: str,
    ready: str,
    started: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve on `listen`, say `ready` and the address on stdout (after `started()`), until
    SIGTERM or SIGINT."""
    port = server.add_insecure_port(listen)
    await server.start()
    if started is not None:
        await started()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host = listen.rpartition(":")[0]
    print(f"{ready}{listen if listen.startswith('unix:') else f'{host}:{port}'}", flush=True)
    await stop.wait()
    await server.stop(grace=None)


class EchoStream:
    """One open echo stream; `await round_trip()` sends an empty message and reads it back."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._call = channel.stream_stream(METHOD)()

    async def round_trip(self) -> None:
        await self._call.write(b"")
        await self._call.read()

    async def close(self) -> None:
        await self._call.done_writing()
        self._call.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0")
    asyncio.run(serve(parser.parse_args().listen))
