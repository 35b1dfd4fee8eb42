"""Builds, starts and drains the sidecar's gRPC server."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from .config import SidecarConfig
from .registry import Registry
from .service import SystemPromptService

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SystemPromptService"].full_name


@dataclass
class Sidecar:
    """A running sidecar: its server, registry and bound address."""

    server: grpc.aio.Server
    service: SystemPromptService
    health: health_aio.HealthServicer
    address: str
    config: SidecarConfig

    @property
    def registry(self) -> Registry:
        return self.service.registry

    async def drain(self) -> None:
        """SIGTERM behaviour: NOT_SERVING, refuse new calls, let in-flight ones
        finish within the grace period, then end every session and stop."""
        await self.health.enter_graceful_shutdown()
        self.service.gate.close()
        await self.service.gate.wait_idle(self.config.shutdown_grace_s)
        await self.server.stop(grace=None)

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def start_sidecar(config: SidecarConfig, listen: str = "127.0.0.1:50051") -> Sidecar:
    """Start serving on `listen` (HOST:PORT, port 0 for any, or unix:PATH)."""
    server = grpc.aio.server()
    service = SystemPromptService(Registry(config.registry), watch_buffer=config.watch_buffer)
    pb_grpc.add_SystemPromptServiceServicer_to_server(service, server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    port = server.add_insecure_port(listen)
    await server.start()
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Sidecar(server, service, health, bound_address(listen, port), config)


def bound_address(listen: str, port: int) -> str:
    """The address actually bound: `listen` with port 0 replaced."""
    if listen.startswith("unix:"):
        return listen
    host, _, _ = listen.rpartition(":")
    return f"{host}:{port}"
