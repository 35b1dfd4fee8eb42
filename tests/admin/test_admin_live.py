"""The admin page's live views: bounded per client, ended when idle; the Scopes view pages."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.admin import live
from helpers import SidecarFactory


@pytest.fixture
async def page(make_sidecar: SidecarFactory) -> Sidecar:
    return await make_sidecar(admin_listen="127.0.0.1:0")


def url(sidecar: Sidecar, path: str) -> str:
    assert sidecar.admin is not None
    return sidecar.admin.url.rstrip("/") + path


@contextlib.asynccontextmanager
async def client(address: str) -> AsyncIterator[aiohttp.ClientSession]:
    """A client of its own loopback address: the page counts live views per client."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        yield session


async def first_event(response: aiohttp.ClientResponse) -> bytes:
    async for line in response.content:
        if line.startswith(b"event: "):
            return line.strip()
    return b""


async def test_one_client_cannot_hold_every_live_view(page: Sidecar) -> None:
    async with client("127.0.0.2") as greedy, client("127.0.0.3") as other:
        held = [await greedy.get(url(page, "/events/scopes")) for _ in range(live.MAX_PER_CLIENT)]
        for response in held:
            assert await first_event(response) == b"event: update"
        refused = await greedy.get(url(page, "/events/scopes"))
        served = await other.get(url(page, "/events/scopes"))
        assert refused.status == 503
        assert "this client has 4 live views open already" in await refused.text()
        assert served.status == 200
        for response in [*held, served]:
            response.close()


async def test_a_live_view_ends_after_its_time_and_says_so(
    page: Sidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "LIVE_VIEW_S", 0.2)
    async with client("127.0.0.4") as session:
        response = await session.get(url(page, "/events/scopes"))
        events = [line.strip() async for line in response.content if line.startswith(b"event:")]
    assert events == [b"event: update", b"event: idle"]


async def test_a_large_registry_pages_the_scopes_view(page: Sidecar) -> None:
    registry = page.registry
    handle = registry.open_scope("owner", "big")
    for index in range(600):
        registry.register_section("owner", handle.id, f"part-{index:03d}", index, "x")
    async with client("127.0.0.5") as session:
        first = await (await session.get(url(page, "/scopes"))).text()
        last = await (await session.get(url(page, "/scopes?page=3"))).text()
    # 250 rows a page: the two built-ins of the global layer, then the scope's first 248
    assert "page 1 of 3" in first and "part-247" in first and "part-248" not in first
    assert "page 3 of 3" in last and "part-599" in last and "part-497" not in last


async def test_a_head_request_for_a_live_view_is_bounded_too(page: Sidecar) -> None:
    async with client("127.0.0.6") as session:
        views = url(page, "/events/sessions")
        held = [await session.get(views) for _ in range(live.MAX_PER_CLIENT)]
        await asyncio.gather(*(first_event(response) for response in held))
        head = await session.head(url(page, "/events/sessions"))
        assert head.status == 503
        for response in held:
            response.close()
