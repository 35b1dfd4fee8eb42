"""How the attackers (`bench.attacks`, `bench.trust_attacks`) count what the sidecar answered."""

from __future__ import annotations

import collections
from collections.abc import Awaitable
from typing import Any

import dsh_system_prompt as dsp
import grpc.aio

Counts = collections.Counter[str]


async def tally(counts: Counts, name: str, call: Awaitable[object]) -> None:
    """Await `call`, counted as `name: ok` or by what refused it."""
    try:
        await call
        counts[f"{name}: ok"] += 1
    except grpc.aio.AioRpcError as error:
        counts[f"{name}: {error.code().name}"] += 1
    except dsp.SystemPromptError as error:
        counts[f"{name}: {error.code.name} {error.reason}"] += 1


async def answered(call: Any, counts: Counts, name: str, answer: str) -> bool:
    """Whether the stream `call` sent its first message; counted as `name: answer`, or
    by the status code it was refused with."""
    try:
        await call.read()
    except grpc.aio.AioRpcError as error:
        counts[f"{name}: {error.code().name}"] += 1
        return False
    counts[f"{name}: {answer}"] += 1
    return True
