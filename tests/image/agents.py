"""Agents in the pod's agent container, driven line by line from the tests."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from typing import Any


class Lines:
    """A process's stdout read on a thread, so a test can wait for a line with a deadline."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def next(self, seconds: float) -> str:
        try:
            line = self._queue.get(timeout=seconds)
        except queue.Empty:
            raise AssertionError(f"no line within {seconds} s; so far: {self.seen}") from None
        if line is None:
            stderr = self.process.stderr.read() if self.process.stderr else ""
            raise AssertionError(f"the process ended; so far: {self.seen}; stderr: {stderr}")
        self.seen.append(line)
        return line

    def until(self, text: str, seconds: float) -> list[str]:
        """The lines read up to and with the first one containing `text`."""
        lines = []
        while text not in (line := self.next(seconds)):
            lines.append(line)
        return [*lines, line]


class Running:
    """`podman run --interactive` of a container named `name`, its stdout read by line."""

    def __init__(self, name: str, command: list[str]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines = Lines(self.process)

    def close(self) -> None:
        """The container removed at once (a Python PID 1 without a SIGTERM handler would
        ignore podman's SIGTERM), then the podman client reaped."""
        subprocess.run(["podman", "rm", "--force", "--time", "0", self.name], capture_output=True)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)


class Agent(Running):
    """tests/image/pod_agent.py in the agent container: a command in, one JSON line out."""

    def __init__(self, name: str, command: list[str]) -> None:
        super().__init__(name, command)
        assert self.answer(60) == {"ready": True}

    def answer(self, seconds: float = 30) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.lines.next(seconds))
        return message

    def ask(self, command: str, seconds: float = 30) -> dict[str, Any]:
        self.send(command)
        return self.answer(seconds)

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
