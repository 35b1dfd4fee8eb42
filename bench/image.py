"""`python -m bench.image`: the image's figures (make bench-image, beside make bench).

    python -m bench.image IMAGE [--runs 5] [--write]

Image size, what the project adds over its base (the base the image's LABEL names: the
runtime stage, the distroless system and the third-party packages), each layer's size, the
time from `podman run` to the first SERVING answer of a health check through a published
port, and the sidecar's resident memory inside the container once idle. Run through
scripts/image-test.sh --bench, which builds the image and sets podman's state; --write
records bench/image.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

HERE = Path(__file__).resolve().parent
MIB = 2**20


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=True).stdout


def inspect(tag: str, template: str) -> str:
    return podman("image", "inspect", "--format", template, tag).strip()


def layers(tag: str) -> list[float]:
    """The sizes of the image's layers that hold files, bottom to top (the Dockerfile's
    order: system, dependencies, project, entry point), in MiB."""
    history = json.loads(podman("history", "--format", "json", tag))
    return [round(entry["size"] / MIB, 1) for entry in reversed(history) if entry["size"]]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def serving(address: str) -> bool:
    """One grpc.health.v1 check from this process (a CLI per poll would cost more than
    what it measures)."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def start_to_serving(tag: str) -> tuple[float, float, int]:
    """Seconds from `podman run` to SERVING and from the container's start (its process
    running, as the runtime records it) to SERVING; VmRSS (KiB) of the sidecar 3 s later."""
    name, port = f"dsp-bench-{uuid.uuid4().hex[:8]}", free_port()
    started = time.perf_counter()
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--read-only",
        "--cap-drop",
        "ALL",
        "--publish",
        f"127.0.0.1:{port}:50051",
        tag,
    )
    try:
        while not serving(f"127.0.0.1:{port}"):
            if time.perf_counter() - started > 60:
                raise RuntimeError(f"{name} not serving after 60 s")
            time.sleep(0.01)
        served_at = time.time()
        elapsed = time.perf_counter() - started
        running_at = float(
            podman(
                "inspect",
                "--format",
                '{{.State.StartedAt.Unix}}.{{printf "%09d" .State.StartedAt.Nanosecond}}',
                name,
            ).strip()
        )
        time.sleep(3)  # idle: no client, after start-up's garbage is gone
        status = podman("exec", name, "cat", "/proc/1/status")
        rss = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return elapsed, served_at - running_at, int(rss.split()[1])
    finally:
        podman("rm", "--force", "--time", "0", name)


def spread(values: list[float], runs: int) -> dict[str, float | int]:
    return {
        "median": round(statistics.median(values), 2),
        "min": round(min(values), 2),
        "max": round(max(values), 2),
        "runs": runs,
    }


def measure(tag: str, runs: int) -> dict[str, Any]:
    base = inspect(tag, '{{index .Labels "org.opencontainers.image.base.name"}}')
    size, base_size = int(inspect(tag, "{{.Size}}")), int(inspect(base, "{{.Size}}"))
    samples = [start_to_serving(tag) for _ in range(runs)]
    return {
        "image": tag,
        "base": base,
        "image_mib": round(size / MIB, 1),
        "base_mib": round(base_size / MIB, 1),
        "added_mib": round((size - base_size) / MIB, 1),
        "layers_mib": layers(tag),
        "run_to_serving_s": spread([run for run, _, _ in samples], runs),
        "start_to_serving_s": spread([start for _, start, _ in samples], runs),
        "idle_rss_mib": round(statistics.median(kib for _, _, kib in samples) / 1024, 1),
        # Times on a shared machine move with its load: the figures say what it was.
        "load_average_1m": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.image", description=__doc__)
    parser.add_argument("image")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="record bench/image.json")
    args = parser.parse_args(argv)
    figures = measure(args.image, args.runs)
    print(
        f"image {figures['image']}: {figures['image_mib']} MiB, {figures['added_mib']} MiB "
        f"over its base {figures['base']} ({figures['base_mib']} MiB); layers, bottom to "
        f"top: {', '.join(str(mib) for mib in figures['layers_mib'])} MiB"
    )
    for label, key in (
        ("podman run", "run_to_serving_s"),
        ("container start", "start_to_serving_s"),
    ):
        timing = figures[key]
        print(
            f"{label} to SERVING: {timing['median']} s median of {timing['runs']} "
            f"({timing['min']}-{timing['max']} s)"
        )
    print(
        f"idle RSS of the sidecar in the container: {figures['idle_rss_mib']} MiB "
        f"(load average {figures['load_average_1m']} on {figures['cpus']} CPUs)"
    )
    if args.write:
        (HERE / "image.json").write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
