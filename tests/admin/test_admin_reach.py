"""The admin page shows a reader only what its scopes reach (issue 34, item 1's admin half):
every route and every query parameter (scope, report key, the pickers) decided as the gRPC
call that reads the same thing, over plain HTTP on a real socket; and a live view ends once
a reload takes its credential's reach away.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar, load_config, start_sidecar
from dsh_system_prompt_server.sidecar.reload import Reloader

TOKENS = {
    "admin": "reach-admin-token-0123",
    "alice": "reach-alice-token-4567",  # reader of alice and alice/*, with values
    "everyone": "reach-everyone-token-89ab",  # reader of every scope, with values
}
ALICE = ["alice", "alice/*"]
SECRET = "bob's private notes"


def config_text(alice: list[str] | None, everyone: tuple[str, ...] = ("*",)) -> str:
    lines = ['auth_token_file = "admin.token"', 'admin_listen = "127.0.0.1:0"']
    readers = [("everyone", list(everyone)), ("alice", alice)]
    for name, scopes in readers:
        if scopes is None:
            continue
        listed = ", ".join(f'"{scope}"' for scope in scopes)
        lines += ["[[credentials]]", f'name = "{name}"', 'role = "reader"', "values = true"]
        lines += [f'token_file = "{name}.token"', f"scopes = [{listed}]"]
    return "\n".join(lines) + "\n"


@dataclass
class Page:
    sidecar: Sidecar
    config: Path

    @property
    def url(self) -> str:
        assert self.sidecar.admin is not None
        return self.sidecar.admin.url.rstrip("/")


@pytest.fixture
async def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Page]:
    """alice's and bob's scopes, each with a section and a report under a key of its own."""
    monkeypatch.chdir(tmp_path)
    for name, token in TOKENS.items():
        (tmp_path / f"{name}.token").write_text(token + "\n")
    config = tmp_path / "sidecar.toml"
    config.write_text(config_text(ALICE))
    sidecar = await start_sidecar(load_config(config), "127.0.0.1:0")
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin:
        for key, text in (("alice", "alice's notes"), ("bob", SECRET)):
            scope = await admin.scope(key)
            await scope.section(f"{key}-notes", 5, text)
            await admin.assemble(scope=key, report=True)
            await admin.assemble(scope=key, report=True, report_key=f"{key}/conv-7")
        yield Page(sidecar, config)  # its session kept open: its registrations too
    await sidecar.server.stop(grace=None)
    await sidecar.close_admin()


async def get(page: Page, path: str, who: str) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {TOKENS[who]}"}
    method = "HEAD" if path.startswith("/events/") else "GET"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, page.url + path, headers=headers) as response,
    ):
        return response.status, await response.text() if method == "GET" else ""


async def first_event(page: Page, path: str, who: str) -> str:
    """The first fragment a live view sends."""
    headers = {"Authorization": f"Bearer {TOKENS[who]}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(page.url + path, headers=headers) as response,
    ):
        assert response.status == 200
        async with asyncio.timeout(10):
            text = ""
            while "\n\n" not in text:
                text += (await response.content.readany()).decode()
        return text


# route with its parameters: who may open it (others are 403)
EVERY_READER = {"admin", "alice", "everyone"}
POD_WIDE = {"admin", "everyone"}
ROUTES = {
    "/scopes": EVERY_READER,
    "/sessions": POD_WIDE,  # every session, whatever it registered where
    "/prompt": EVERY_READER,  # the global layer
    "/prompt?scope=alice": EVERY_READER,
    "/prompt?scope=bob": POD_WIDE,
    "/cache": EVERY_READER,
    "/cache?scope=alice": EVERY_READER,
    "/cache?scope=bob": POD_WIDE,
    "/cache?key=alice/conv-7": EVERY_READER,
    "/cache?key=bob/conv-7": POD_WIDE,
    "/cache?scope=alice&key=bob/conv-7": POD_WIDE,  # the key is what the view shows
}
ROUTES.update({f"/events{path}": who for path, who in ROUTES.items()})
CASES = [(route, who) for route in ROUTES for who in sorted(TOKENS)]


@pytest.mark.parametrize(("route", "who"), CASES, ids=[f"{w}: {r}" for r, w in CASES])
async def test_each_route_and_parameter_is_decided_by_the_readers_reach(
    page: Page, route: str, who: str
) -> None:
    status, text = await get(page, route, who)
    assert status == (200 if who in ROUTES[route] else 403), text
    if status == 403 and not route.startswith("/events/"):
        assert f'credential "{who}" (reader)' in text
        if "bob" in route:
            assert "is not in its scopes (alice, alice/*)" in text
    if status == 200 and who == "alice":
        assert "bob" not in text


@pytest.mark.parametrize("who", sorted(TOKENS))
async def test_the_scopes_view_shows_only_the_scopes_it_reaches(page: Page, who: str) -> None:
    _, html = await get(page, "/scopes", who)
    live = await first_event(page, "/events/scopes", who)
    for shown in (html, live):
        assert "alice-notes" in shown
        assert ("bob" in shown) is (who != "alice")  # bob's scope, its section, its owner


async def fails(assembly: object, context: object, next_: dsp.Next) -> object:
    raise RuntimeError("the listener's own words")


@pytest.mark.parametrize("who", sorted(TOKENS))
async def test_steps_outside_its_scopes_are_shown_without_their_names(page: Page, who: str) -> None:
    """A rule in the global layer (Scopes) and a global listener held in bob's scope that an
    assembly of alice's skipped (Cache): by name only to a reader of every scope."""
    async with dsp.connect(page.sidecar.address, token=TOKENS["admin"]) as admin:
        await admin.rule("admins-secret-rule", dsp.Rule([dsp.Mutation.drop_tools("false")]))
        held = await admin.scope("bob")
        ignore = dsp.FailurePolicy.IGNORE
        await held.on_assemble(fails, global_=True, name="secret-listener", failure_policy=ignore)
        await admin.assemble(scope="alice", report=True)
        scopes = [*await both(page, "/scopes", who)]
        cache = [*await both(page, "/cache?scope=alice", who)]
    named = who != "alice"
    for shown in scopes:
        assert ("admins-secret-rule" in shown) is named
    for shown in cache:
        assert "LISTENER_FAILED" in shown
        assert ("secret-listener" in shown) is named
        assert ("the listener&#39;s own words" in shown) is named


async def both(page: Page, path: str, who: str) -> tuple[str, str]:
    """A view as its page and as its live view's first fragment."""
    status, html = await get(page, path, who)
    assert status == 200
    return html, await first_event(page, "/events" + path, who)


@pytest.mark.parametrize("who", sorted(TOKENS))
async def test_the_prompt_picker_lists_only_the_scopes_it_reaches(page: Page, who: str) -> None:
    _, html = await get(page, "/prompt?scope=alice", who)
    assert '<option value="alice" selected>' in html
    assert ('<option value="bob"' in html) is (who != "alice")


@pytest.mark.parametrize("who", sorted(TOKENS))
async def test_the_cache_picker_lists_only_the_histories_it_reaches(page: Page, who: str) -> None:
    _, html = await get(page, "/cache?key=alice/conv-7", who)
    assert "key &#34;alice/conv-7&#34;" in html or 'key "alice/conv-7"' in html
    for bobs in ("bob/conv-7", "scope &#34;bob&#34;"):
        assert (bobs in html) is (who != "alice"), bobs


async def test_a_live_view_ends_once_a_reload_takes_its_reach_away(page: Page) -> None:
    reloader = Reloader(page.sidecar, str(page.config), lambda: load_config(page.config))
    headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
    async with aiohttp.ClientSession() as session:
        kept = await session.get(page.url + "/events/prompt?scope=alice", headers=headers)
        narrowed = await session.get(page.url + "/events/cache?key=alice/conv-7", headers=headers)
        page.config.write_text(config_text(["alice"]))  # alice/* no longer
        assert reloader.reload("test") is not None
        async with asyncio.timeout(10):
            ended = (await narrowed.content.read()).decode()
        assert ended.rstrip().endswith("event: revoked\ndata:")
        assert not kept.content.at_eof()
        page.config.write_text(config_text(None))  # alice removed
        assert reloader.reload("test") is not None
        async with asyncio.timeout(10):
            assert (await kept.content.read()).decode().rstrip().endswith("event: revoked\ndata:")
        kept.close()
        narrowed.close()


async def test_a_live_scopes_view_ends_once_a_reload_narrows_its_reach(page: Page) -> None:
    """The Scopes view is never refused, only filtered: narrowed from '*' to alice's scopes,
    the reader's open live view ends (its browser opens it again, filtered anew) rather than
    go on showing bob's scope as it was rendered for '*'."""
    reloader = Reloader(page.sidecar, str(page.config), lambda: load_config(page.config))
    headers = {"Authorization": f"Bearer {TOKENS['everyone']}"}
    async with aiohttp.ClientSession() as session:
        live = await session.get(page.url + "/events/scopes", headers=headers)
        async with asyncio.timeout(10):
            first = ""
            while "\n\n" not in first:
                first += (await live.content.readany()).decode()
        assert "bob-notes" in first
        page.config.write_text(config_text(ALICE, everyone=("alice",)))
        assert reloader.reload("test") is not None
        async with asyncio.timeout(10):
            ended = (await live.content.read()).decode()
        live.close()
        _, again = await get(page, "/scopes", "everyone")
    assert ended.rstrip().endswith("event: revoked\ndata:")
    assert "bob-notes" not in again and "alice-notes" in again
