"""A coroutine stepped without a task (`step_through`, the streams' writes) is heard to its
end whatever ends it, so a stream's writer is never left waiting for a write gone."""

from __future__ import annotations

import asyncio

from dsh_system_prompt_core import step_through


async def _waiting_on(future: asyncio.Future[None]) -> None:
    await future


async def test_a_stepped_coroutine_is_heard_to_end_when_what_it_waits_for_is_cancelled() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    heard: list[BaseException | None] = []
    step_through(_waiting_on(future), heard.append)
    assert heard == []  # waiting: its first step ran now
    future.cancel()
    await asyncio.sleep(0)
    assert len(heard) == 1 and isinstance(heard[0], asyncio.CancelledError)


async def test_a_stepped_coroutine_is_heard_to_end_with_its_result_or_its_error() -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    heard: list[BaseException | None] = []
    step_through(_waiting_on(done), heard.append)
    step_through(_waiting_on(failing), heard.append)
    done.set_result(None)
    failing.set_exception(OSError("gone"))
    await asyncio.sleep(0)
    assert heard[0] is None and isinstance(heard[1], OSError)
