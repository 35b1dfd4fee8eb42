"""Podman, driven as a user would drive it, for the image tests (tests/image).

scripts/image-test.sh sets CONTAINERS_CONF and CONTAINERS_STORAGE_CONF, so every command
here uses the project's own engine state under build/containers/, and DSP_IMAGE, the tag
it built. Names are unique per test run, so two runs on one machine never meet.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[2]
RUN_ID = uuid.uuid4().hex[:8]
T = TypeVar("T")


def image() -> str:
    """The image under test: what scripts/image.sh built (DSP_IMAGE)."""
    tag = os.environ.get("DSP_IMAGE")
    assert tag, "DSP_IMAGE is unset: run the image tests through `make image-test`"
    return tag


def name(what: str) -> str:
    """A container, pod or volume name of this run."""
    return f"dsp-test-{RUN_ID}-{what}"


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run one podman command; a failure shows what podman said."""
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
        )
    return result


def eventually(probe: Callable[[], T | None], seconds: float, what: str) -> T:
    """probe()'s first answer that is not None, asked every 0.1 s for `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        answer = probe()
        if answer is not None:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.1)


@dataclass
class Container:
    """A container by name, with the few questions the tests ask of it."""

    name: str

    def exec(self, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=False, timeout=timeout)

    def inspect(self, template: str) -> str:
        return podman("inspect", "--format", template, self.name).stdout.strip()

    def running(self) -> bool:
        return self.inspect("{{.State.Running}}") == "true"

    def exit_code(self) -> int:
        return int(self.inspect("{{.State.ExitCode}}"))

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def proc_status(self) -> dict[str, str]:
        """/proc/1/status of the container's main process, read from inside it."""
        text = self.exec("cat", "/proc/1/status").stdout
        return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}

    def serving(self, address: str) -> bool:
        """What the image's own health command says, run inside the container."""
        result = self.exec("dsh-system-prompt", "health", "--address", address, "--timeout", "2")
        return result.returncode == 0

    def wait_serving(self, address: str, seconds: float = 30) -> None:
        def up() -> bool | None:
            if not self.running():
                raise AssertionError(f"{self.name} stopped:\n{self.logs()[-3000:]}")
            return True if self.serving(address) else None

        eventually(up, seconds, f"{self.name} serving on {address}")


@dataclass
class Cleanup:
    """What a test made, removed at its end whatever happened."""

    containers: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)

    def close(self) -> None:
        for container in reversed(self.containers):
            podman("rm", "--force", "--time", "0", container, check=False)
        for pod in self.pods:
            podman("pod", "rm", "--force", "--time", "0", pod, check=False)
        for volume in self.volumes:
            podman("volume", "rm", "--force", volume, check=False)
        for mount in self.mounts:
            subprocess.run(["umount", mount], check=False, capture_output=True)


@contextlib.contextmanager
def cleanup() -> Iterator[Cleanup]:
    made = Cleanup()
    try:
        yield made
    finally:
        made.close()
