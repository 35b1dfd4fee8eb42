"""A coroutine run without a task of its own: its first step now, the rest as it is woken.

A stream's write is a coroutine that starts gRPC's send in its first step and then
waits for it. Run in a task, the send starts a loop turn late; awaited by the sender,
the sender waits for it, and a sender cancelled meanwhile (its deadline) cancels the
write half-sent, after which grpc.aio fails the stream's next write. `step_through`
starts it in the caller's step and resumes it from the loop's callbacks, as a task
would, with no task: nothing can cancel it, and nobody waits for it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Generator
from typing import Any

Finished = Callable[[BaseException | None], None]
"""Hears a stepped coroutine's end: None, or the exception it raised (a cancellation too)."""


def step_through(work: Awaitable[object], finished: Finished) -> None:
    """Run `work` to its first wait now, and on from there each time what it waits for is
    done; `finished` hears its end (maybe before this returns, if it never waits)."""
    _step(work.__await__(), finished)


def _step(steps: Generator[Any, None, object], finished: Finished, _: object = None) -> None:
    try:
        waiting = steps.send(None)  # a future reads its own result when resumed
    except StopIteration:
        finished(None)
        return
    except (Exception, asyncio.CancelledError) as error:  # a cancelled wait ends it too
        finished(error)
        return
    if waiting is None:  # a bare yield: on the loop's next turn
        asyncio.get_running_loop().call_soon(_step, steps, finished)
    else:  # a future, as asyncio's protocol has it: once it is done
        waiting._asyncio_future_blocking = False
        waiting.add_done_callback(functools.partial(_step, steps, finished))
