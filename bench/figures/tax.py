"""The sidecar tax: what one idle sidecar costs every pod, against the floor of its own runtime
measured in the same run (`bench/floor.py`: a bare grpc.aio server in this venv with the
project's stubs and grpc health), and what each connected session and each static
registration adds; the image's size from `make bench-image`'s results."""

from __future__ import annotations

import asyncio
import compileall
import json
import random
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .. import procs
from ..report import Figure, X, at_most
from ..stats import ORDER_SEED, ratio
from ..targets import TARGETS
from .build import figure
from .harness import Harness, gather_limited

IMAGE_RESULTS = Path(__file__).resolve().parent.parent / "image.json"
SETTLE_S = 1.0  # after SERVING, before memory and CPU are read: start-up's last work done
POLL_S = 0.002
# The probe's channel retries a refused connection this soon: under gRPC's default reconnect
# backoff (1 s, then 1.6 s more, jittered) a probe that starts before the server listens
# sees SERVING only at the next retry, so the figure read ~1 s or ~2.6 s whatever the start.
PROBE_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 5),
    ("grpc.min_reconnect_backoff_ms", 5),
    ("grpc.max_reconnect_backoff_ms", 5),
]
TEXT_BYTES = 324  # a static registration's text, as the issue measured it
MIB, KIB = 1 << 20, 1 << 10


async def tax(h: Harness) -> list[Figure]:
    """Start → SERVING, idle memory and idle CPU of the sidecar (default config) and of the
    floor, in turns shuffled each round; then a session's and a registration's memory."""
    runs = max(3, round(5 * h.budget.scale))
    _compile_sources()
    idle_s = max(1.0, 3.0 * h.budget.scale)
    measured: dict[str, list[dict[str, float]]] = {"sidecar": [], "floor": []}
    commands: dict[str, Callable[[str], list[str]]] = {
        "sidecar": procs.sidecar_argv,
        "floor": procs.floor_argv,
    }
    order, names = random.Random(ORDER_SEED), list(commands)
    for _ in range(runs):
        order.shuffle(names)
        for name in names:
            measured[name].append(await _idle_run(commands[name], idle_s))
    sidecar = {key: statistics.median(r[key] for r in measured["sidecar"]) for key in _KEYS}
    floor = {key: statistics.median(r[key] for r in measured["floor"]) for key in _KEYS}
    common = {
        "runs": runs,
        "sidecar": {key: round(value, 3) for key, value in sidecar.items()},
        "floor": {key: round(value, 3) for key, value in floor.items()},
        "order": "sidecar and floor started in turns, shuffled each round; medians",
        "sidecar_command": "dsh-system-prompt serve --listen 127.0.0.1:PORT (the default config)",
        "floor_command": "python -m bench.floor --listen 127.0.0.1:PORT",
        "bytecode": "the project's and the bench's sources compiled first, as an installed"
        " wheel and the image have them",
    }
    cpu = sidecar["cpu_pct"]
    figures = [
        _against_floor("idle_rss", "idle sidecar's resident memory", sidecar, floor, common),
        _against_floor(
            "start_to_serving", "process start → health SERVING", sidecar, floor, common
        ),
        figure(
            "idle_cpu",
            "idle sidecar's CPU, % of a core",
            cpu,
            "%",
            at_most(cpu, TARGETS["idle_cpu"], "≤ {:g} %"),
            {**common, "idle_window_s": idle_s},
            digits=3,
            display=f"{cpu:.3f} % (floor {floor['cpu_pct']:.3f} %)",
        ),
    ]
    figures.append(await _session_memory(h))
    figures.append(await _registration_overhead(h))
    figures.append(_image())
    return figures


# The sources both processes import from this tree (the rest, installed, has its bytecode).
SOURCES = ("server", "core", "client", "bench")


def _compile_sources() -> None:
    """Write the bytecode of this tree's sources, as `pip install` and the image have it
    (under PYTHONDONTWRITEBYTECODE, set in many shells and images, an editable install's
    modules are compiled anew at every start: 0.30 s of CPU to SERVING instead of 0.19 s
    here, the floor's 0.12 and 0.10 s, its own modules installed and compiled but two)."""
    for folder in SOURCES:
        compileall.compile_dir(procs.ROOT / folder, quiet=1)


_KEYS = ("serving_s", "rss_kib", "private_dirty_kib", "cpu_pct")


# A figure against the floor: what it compares, and how the table shows each side.
def _mib(kib: float) -> str:
    return f"{kib / KIB:.1f} MiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


_FLOOR_FIGURES: dict[str, tuple[str, Callable[[float], str]]] = {
    "idle_rss": ("rss_kib", _mib),
    "start_to_serving": ("serving_s", _ms),
}


def _against_floor(
    key: str, name: str, sidecar: dict[str, float], floor: dict[str, float], details: dict[str, Any]
) -> Figure:
    """The figure `key`: the sidecar's median over the floor's, at most its target."""
    measure, shown = _FLOOR_FIGURES[key]
    value = ratio(sidecar[measure], floor[measure])
    display = f"{value:.2f}{X} ({shown(sidecar[measure])} / {shown(floor[measure])})"
    judged = at_most(value, TARGETS[key], "≤ {:g}x the floor")
    return figure(key, f"{name} / the floor's", value, X, judged, details, display=display)


async def _idle_run(argv: Callable[[str], list[str]], idle_s: float) -> dict[str, float]:
    """One process of `argv(listen)`: its start to the first SERVING health check, then,
    idle, its memory and the CPU it used over `idle_s`."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    channel = grpc.aio.insecure_channel(address, options=PROBE_OPTIONS)
    check = health_pb2_grpc.HealthStub(channel).Check
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *argv(address),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=procs.ROOT,
    )
    server = procs.ServerProcess(process, address, "tax")
    try:
        while True:
            try:
                reply = await check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.aio.AioRpcError:
                pass
            if process.returncode is not None or time.perf_counter() - started > 60:
                raise RuntimeError(f"{' '.join(argv(address))} never answered SERVING")
            await asyncio.sleep(POLL_S)
        serving_s = time.perf_counter() - started
        await channel.close()
        await asyncio.sleep(SETTLE_S)
        rss, dirty = server.rss_kib(), server.private_dirty_kib()
        cpu_before, clock = server.cpu_ns(), time.perf_counter()
        await asyncio.sleep(idle_s)
        cpu_pct = (server.cpu_ns() - cpu_before) / 1e9 / (time.perf_counter() - clock) * 100
    finally:
        await channel.close()
        await server.stop()
    return {
        "serving_s": serving_s,
        "rss_kib": rss,
        "private_dirty_kib": dirty,
        "cpu_pct": cpu_pct,
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


STATIC_SECTIONS = 10


async def _session_memory(h: Harness) -> Figure:
    """What one more connected session costs the sidecar: a session holding 10 static
    sections and a dynamic one, opened many times over on a fresh sidecar, its RSS before
    and after (after a warm-up's sessions, so the allocator's first arenas are not counted)."""
    count, warmup = max(20, round(200 * h.budget.scale)), 10
    config = {"limits": {"max_sessions_per_peer": 10 * (count + warmup)}}
    sidecar = await procs.start_sidecar(config=config, label="sidecar-tax-sessions")
    clients: list[dsp.Client] = []
    try:
        await _open_sessions(sidecar.address, clients, warmup)
        await asyncio.sleep(0.5)
        before = sidecar.rss_kib()
        await _open_sessions(sidecar.address, clients, count)
        await asyncio.sleep(0.5)
        after = sidecar.rss_kib()
    finally:
        for client in clients:
            await client.close()
        await sidecar.stop()
    value = (after - before) / count
    details = {
        "sessions": count,
        "warmup_sessions": warmup,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "session": f"dsp.connect() from the bench process, its agent's scope, {STATIC_SECTIONS}"
        " static sections of ~25 bytes and a dynamic one (a provider) there, kept open",
        "note": "each dsp.connect() is a connection of its own (the client sets"
        " grpc.use_local_subchannel_pool), so each session brings what gRPC keeps per"
        " connection as well as per stream",
    }
    judged = at_most(value, TARGETS["session_memory_kib"], "≤ {:g} KiB")
    name = "memory per connected session (10 static sections, 1 dynamic)"
    return figure("session_memory_kib", name, value, "KiB", judged, details, digits=1)


async def _open_sessions(address: str, clients: list[dsp.Client], count: int) -> None:
    """`count` more sessions, each an agent's: its scope, its static sections, a dynamic one."""
    first = len(clients)

    async def one(serial: int) -> None:
        client = await dsp.connect(address, client_name=f"bench-tax-{serial}")
        clients.append(client)
        scope = await client.scope(f"agent-{serial:05d}")
        for section in range(STATIC_SECTIONS):
            await scope.section(f"static-{section}", section, f"Rule {section} of {serial}: ok.")
        await scope.section("dynamic", STATIC_SECTIONS, lambda context: "Answered now.")

    await gather_limited([one(first + index) for index in range(count)], limit=8)


async def _registration_overhead(h: Harness) -> Figure:
    """What a static registration costs the sidecar over its text: many sections of a
    324-byte text registered by one session on a fresh sidecar, its RSS before and after."""
    count, warmup = max(500, round(5000 * h.budget.scale)), 200
    sidecar = await procs.start_sidecar(label="sidecar-tax-registrations")
    try:
        async with dsp.connect(sidecar.address, client_name="bench-tax-registrations") as client:
            await _register(client, 0, warmup)
            await asyncio.sleep(0.5)
            before = sidecar.rss_kib()
            await _register(client, warmup, count)
            await asyncio.sleep(0.5)
            after = sidecar.rss_kib()
    finally:
        await sidecar.stop()
    per_registration = (after - before) * KIB / count
    value = per_registration - TEXT_BYTES
    details = {
        "registrations": count,
        "warmup_registrations": warmup,
        "text_bytes": TEXT_BYTES,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "bytes_per_registration": round(per_registration),
        "registration": "a global static section of one session, a distinct name and text",
    }
    judged = at_most(value, TARGETS["registration_overhead_bytes"], "≤ {:g} B")
    name = "memory per static registration, over its text"
    return figure("registration_overhead_bytes", name, value, "B", judged, details, digits=0)


async def _register(client: dsp.Client, first: int, count: int) -> None:
    async def one(index: int) -> None:
        head = f"Section {index:06d}: "
        await client.section(f"section-{index:06d}", index, head + "x" * (TEXT_BYTES - len(head)))

    await gather_limited([one(index) for index in range(first, first + count)], limit=16)


def _image() -> Figure:
    """The image's size, from `make bench-image`'s bench/image.json when it is there."""
    name = "the image (make bench-image)"
    if not IMAGE_RESULTS.exists():
        return figure("image_mib", name, 0.0, "MiB", "not measured: run make bench-image", {})
    image: dict[str, Any] = json.loads(IMAGE_RESULTS.read_text())
    value = float(image["image_mib"])
    judged = at_most(value, TARGETS["image_mib"], "≤ {:g} MiB")
    details = {"from": "bench/image.json, as make bench-image last wrote it", **image}
    return figure("image_mib", name, value, "MiB", judged, details, digits=1)
