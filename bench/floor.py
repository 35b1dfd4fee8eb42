"""The floor: a bare `grpc.aio` server in this venv with the project's stubs and grpc health,
what any sidecar of this design costs before its own code; the tax figures and the throughput
figure are measured against it in the same run.

It answers `grpc.health.v1.Health` (SERVING, as the sidecar does once started) and
`SystemPromptService/Assemble` with the bytes of `--response` (a file; empty without one),
whatever the request: no registry, no parsing, no servicer logic. Run as
`python -m bench.floor --listen 127.0.0.1:0 [--response FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc  # noqa: F401 - the stubs' cost is the floor's
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from .echo import serve_until_stopped

SERVICE = pb.DESCRIPTOR.services_by_name["SystemPromptService"].full_name
READY = "floor listening on "


async def serve(listen: str, response: bytes) -> None:
    server = grpc.aio.server()

    async def assemble(request: bytes, context: Any) -> bytes:
        return response

    handler = grpc.unary_unary_rpc_method_handler(assemble)  # no (de)serializers: bytes
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Assemble": handler}),)
    )
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)

    async def serving() -> None:
        await health.set("", health_pb2.HealthCheckResponse.SERVING)

    await serve_until_stopped(server, listen, READY, serving)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--response", help="a file: the bytes every Assemble answers")
    args = parser.parse_args()
    asyncio.run(serve(args.listen, Path(args.response).read_bytes() if args.response else b""))
