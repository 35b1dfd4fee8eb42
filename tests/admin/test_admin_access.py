"""Who may open the admin page, and signing in to it, over plain HTTP on a real socket."""

from __future__ import annotations

from http.cookies import SimpleCookie
from pathlib import Path

import aiohttp
import pytest
from dsh_system_prompt_server import Sidecar
from guard.test_roles import TOKENS, roles_config
from helpers import SidecarFactory

ROUTES = ("/scopes", "/sessions", "/prompt", "/cache", "/events/scopes", "/events/prompt")
# who: the routes it may open; every other one is 403
MAY_OPEN = {
    "admin": set(ROUTES),
    "auditor": set(ROUTES),  # a reader with values
    "dashboard": {"/scopes", "/sessions", "/events/scopes"},  # a reader without values
    "planner": set(),  # an agent: the page is for people
    "pod": set(),
}
CASES = [(who, route) for who in sorted(MAY_OPEN) for route in ROUTES]


@pytest.fixture
async def page(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    return await make_sidecar(admin_listen="127.0.0.1:0", **roles_config(tmp_path))


def base(sidecar: Sidecar) -> str:
    assert sidecar.admin is not None
    return sidecar.admin.url.rstrip("/")


async def fetch(
    sidecar: Sidecar, path: str, token: str | None = None, cookie: str | None = None
) -> tuple[int, dict[str, str], str]:
    """One request, no redirect followed: its status, headers and text (HEAD for a stream)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    if cookie is not None:
        headers["Cookie"] = cookie
    method = "HEAD" if path.startswith("/events/") else "GET"
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, base(sidecar) + path, headers=headers, allow_redirects=False
        ) as response,
    ):
        text = await response.text() if method == "GET" else ""
        return response.status, dict(response.headers), text


async def signed_in_cookie(sidecar: Sidecar, token: str) -> tuple[str, SimpleCookie]:
    status, headers, _ = await fetch(sidecar, f"/sign-in?next=/scopes&token={token}")
    assert status == 303
    parsed: SimpleCookie = SimpleCookie(headers["Set-Cookie"])
    morsel = parsed["dsp_admin"]
    return f"dsp_admin={morsel.value}", parsed


@pytest.mark.parametrize(("who", "route"), CASES, ids=[f"{w}: {r}" for w, r in CASES])
async def test_a_credential_opens_the_admin_routes_its_role_allows(
    page: Sidecar, who: str, route: str
) -> None:
    status, _, text = await fetch(page, route, token=TOKENS[who])
    assert status == (200 if route in MAY_OPEN[who] else 403), text
    if status == 403 and who == "dashboard" and not route.startswith("/events/"):
        assert "it is not granted values ('values = true')" in text


async def test_the_sign_in_form_posts_to_a_fixed_path_of_its_own_origin(page: Sidecar) -> None:
    status, _, html = await fetch(page, "//evil.example/prompt")
    assert status == 401
    assert 'action="/sign-in"' in html
    assert "evil.example" not in html


async def test_a_token_in_the_address_redirects_only_to_a_page_of_its_own(page: Sidecar) -> None:
    token = TOKENS["admin"]
    for path in (f"//evil.example/x?token={token}", f"/sign-in?next=//evil.example/&token={token}"):
        status, headers, _ = await fetch(page, path)
        assert (status, headers["Location"]) == (303, "/scopes"), path
    status, headers, _ = await fetch(page, f"/sign-in?next=/prompt%3Fscope%3Da&token={token}")
    assert (status, headers["Location"]) == (303, "/prompt?scope=a")


async def test_the_sign_in_cookie_expires(page: Sidecar) -> None:
    cookie, parsed = await signed_in_cookie(page, TOKENS["admin"])
    morsel = parsed["dsp_admin"]
    assert 0 < int(morsel["max-age"]) <= 8 * 3600
    assert morsel["httponly"] and morsel["samesite"] == "Strict"
    assert TOKENS["admin"] not in cookie
    assert (await fetch(page, "/scopes", cookie=cookie))[0] == 200


async def test_a_restart_signs_everyone_out(make_sidecar: SidecarFactory, tmp_path: Path) -> None:
    config = roles_config(tmp_path)
    first = await make_sidecar(admin_listen="127.0.0.1:0", **config)
    cookie, _ = await signed_in_cookie(first, TOKENS["admin"])
    assert first.admin is not None
    port = first.admin.address.rpartition(":")[2]
    await first.server.stop(grace=None)
    await first.close_admin()
    again = await make_sidecar(admin_listen=f"127.0.0.1:{port}", **config)  # same token, port
    assert (await fetch(again, "/scopes", cookie=cookie))[0] == 401


async def test_a_cookie_of_one_admin_page_does_not_open_another_port(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = roles_config(tmp_path)
    one = await make_sidecar(admin_listen="127.0.0.1:0", **config)
    other = await make_sidecar(admin_listen="127.0.0.1:0", **config)
    cookie, _ = await signed_in_cookie(one, TOKENS["admin"])
    assert (await fetch(other, "/scopes", cookie=cookie))[0] == 401


async def test_a_readers_cookie_keeps_the_readers_limits(page: Sidecar) -> None:
    cookie, _ = await signed_in_cookie(page, TOKENS["dashboard"])
    assert (await fetch(page, "/scopes", cookie=cookie))[0] == 200
    assert (await fetch(page, "/prompt", cookie=cookie))[0] == 403
