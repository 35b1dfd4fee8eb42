"""Live admin views in a process of their own: `python -m bench.admin_views URL COUNT`.

Opens COUNT live views (server-sent events) of the admin page at URL, half the
Scopes view and half the Prompt view of `scope-N`, from 4 loopback addresses
(four "clients": the page bounds live views per client), and reads every update,
doing nothing else. Prints READY once each has its first update; runs until killed.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp

READY = "viewing "
CLIENTS = 4  # loopback addresses 127.0.0.2 .. 127.0.0.5


def path(index: int) -> str:
    return "/events/scopes" if index % 2 == 0 else f"/events/prompt?scope=scope-{index}"


async def _view(session: aiohttp.ClientSession, url: str, first: asyncio.Event) -> None:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as response:
        response.raise_for_status()
        async for line in response.content:
            if line.startswith(b"event: update"):
                first.set()


async def main(url: str, count: int) -> None:
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(f"127.0.0.{2 + i}", 0), limit=0)
        )
        for i in range(CLIENTS)
    ]
    firsts = [asyncio.Event() for _ in range(count)]
    tasks = [
        asyncio.create_task(_view(sessions[i % CLIENTS], url.rstrip("/") + path(i), firsts[i]))
        for i in range(count)
    ]
    waiting = asyncio.gather(*(event.wait() for event in firsts))
    racing: list[asyncio.Future[Any]] = [waiting, *tasks]  # the first update, or a view failing
    done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
    for task in done:
        if task is not waiting:
            task.result()  # a view that failed: say why
    print(f"{READY}{count}", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
