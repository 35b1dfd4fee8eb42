"""The read-only admin page (`--admin-listen`), driven in a real headless Chromium.

Debian's Chromium (`make browser` installs it) is launched by Playwright; no
browser is downloaded. Each view's screenshot is taken; with
DSP_ADMIN_SCREENSHOTS=1 (`make screenshots`), or when one is missing, it is
written to docs/admin/, else to the test's temporary folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import ConfigError, Sidecar, parse_config
from helpers import SidecarFactory, eventually, tool
from playwright.async_api import Browser, Page, async_playwright, expect

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "admin"
TOKEN = "admin-test-token"
IGNORE = dsp.FailurePolicy.IGNORE
WAIT_MS = 10_000  # a loaded 2-core machine; the page itself updates within a tick


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(viewport={"width": 1200, "height": 800})
    opened = await context.new_page()
    yield opened
    await context.close()


@pytest.fixture
async def admin(make_sidecar: SidecarFactory) -> Sidecar:
    """A sidecar serving its admin page on a free loopback port, counting tokens."""
    return await make_sidecar(admin_listen="127.0.0.1:0", tokenizer="deepseek-v4")


@pytest.fixture
async def guarded(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    """A sidecar whose gRPC API and admin page ask for a bearer token."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return await make_sidecar(admin_listen="127.0.0.1:0", auth_token_file=str(token_file))


def url(sidecar: Sidecar, path: str) -> str:
    assert sidecar.admin is not None
    return sidecar.admin.url.rstrip("/") + path


async def screenshot(page: Page, name: str, tmp_path: Path) -> None:
    target = DOCS / f"{name}.png"
    if not os.environ.get("DSP_ADMIN_SCREENSHOTS") and target.exists():
        target = tmp_path / f"{name}.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(target), full_page=True)
    assert target.stat().st_size > 0


# -- the prompt -----------------------------------------------------------------------


async def test_the_live_prompt_changes_when_a_client_updates_a_section(
    admin: Sidecar, page: Page, tmp_path: Path
) -> None:
    async with dsp.connect(admin.address, client_name="memory-agent") as client:
        await client.section("rules", 10, "Be brief.")
        await client.tools([tool("bash"), tool("read")])
        agent = await client.scope("agent-1")
        memory = await agent.section("memory", 20, "The user likes tea.")
        await page.goto(url(admin, "/prompt?scope=agent-1"))
        memory_part = page.locator('#live .part[data-name="memory"] .part-text')
        await expect(memory_part).to_have_text("The user likes tea.", timeout=WAIT_MS)
        await page.evaluate("window.notReloaded = true")

        await memory.update("The user likes coffee.")

        await expect(memory_part).to_have_text("The user likes coffee.", timeout=WAIT_MS)
        verdict = page.locator("#verdict")
        await expect(verdict).to_contain_text('section "memory"', timeout=WAIT_MS)
        await expect(verdict).to_contain_text("breaks the prompt cache")
        changed = page.locator("#live .part .badge.changed")
        assert await changed.evaluate_all("b => b.map(e => e.closest('.part').dataset.name)") == [
            "memory"
        ]
        assert await page.evaluate("window.notReloaded === true"), "the page was reloaded"
        await screenshot(page, "prompt", tmp_path)


async def test_each_part_says_where_it_came_from_with_its_sizes(admin: Sidecar, page: Page) -> None:
    async with dsp.connect(admin.address) as client:
        await client.section("rules", 10, "Be brief.")
        await client.tools([tool("zeta"), tool("alpha"), tool("mid")])
        team = await client.scope("team")
        await team.section("team:style", 5, "Write in English.")
        agent = await client.scope("agent-1", parent="team")
        await agent.section("memory", 20, "Remember the tea.")
        await page.goto(url(admin, "/prompt?scope=agent-1"))

        origins = {
            ("section", "harness:identity"): "origin-builtin",
            ("section", "rules"): "origin-global",
            ("section", "team:style"): "origin-ancestor",
            ("section", "memory"): "origin-scope",
        }
        for (kind, name), colour in origins.items():
            located = page.locator(f'#live .part[data-kind="{kind}"][data-name="{name}"]')
            await expect(located).to_have_class(f"part {colour}", timeout=WAIT_MS)
        memory = page.locator('#live .part[data-name="memory"] .part-size')
        await expect(memory).to_contain_text("17 bytes")
        await expect(memory).to_contain_text("tokens")
        model_order = [t.name for t in (await client.assemble("agent-1")).tools]
        tools = page.locator('#live .part[data-kind="tool"]')
        shown = await tools.evaluate_all("parts => parts.map(p => p.dataset.name)")
        assert shown == model_order


async def test_dynamic_parts_are_placeholders_never_evaluated(admin: Sidecar, page: Page) -> None:
    calls = 0

    def cwd(context: dsp.AssembleContext) -> str:
        nonlocal calls
        calls += 1
        return "Working directory: /work."

    async with dsp.connect(admin.address) as client:
        await client.context("cwd", 10, cwd)
        await page.goto(url(admin, "/prompt"))
        text = page.locator('#live .part[data-name="cwd"] .part-text')
        await expect(text).to_have_text('<dynamic context "cwd">', timeout=WAIT_MS)
        await expect(page.locator('#live .part[data-name="cwd"]')).to_have_class(
            "part origin-global dynamic"
        )
        assert calls == 0


async def test_client_text_is_shown_as_text_never_as_markup(admin: Sidecar, page: Page) -> None:
    hostile = '<img src="/x" onerror="window.pwned = true"><b id="injected">bold</b>'
    async with dsp.connect(admin.address, client_name='<i id="named">x</i>') as client:
        await client.section("<script>", 10, hostile)
        for view in ("/prompt", "/scopes", "/sessions"):
            await page.goto(url(admin, view))
            await expect(page.locator("#live")).to_contain_text(
                "<script>" if view != "/sessions" else '<i id="named">'
            )
            assert await page.locator("#injected, #named").count() == 0
            assert await page.evaluate("window.pwned === undefined")


# -- the cache ------------------------------------------------------------------------


async def test_the_cache_chart_shows_a_break_after_a_timestamp_section_is_added(
    admin: Sidecar, page: Page, tmp_path: Path
) -> None:
    async with dsp.connect(admin.address) as client:
        agent = await client.scope("agent-1")
        await agent.section("rules", 10, "Be brief.")
        await client.tools([tool("bash")])
        for _ in range(2):
            await client.assemble("agent-1", report=True)
        await page.goto(url(admin, "/cache?scope=agent-1"))
        chart = page.locator("#cache-chart")
        await expect(chart.locator("rect.bar")).to_have_count(2, timeout=WAIT_MS)
        assert await chart.locator("rect.bar.break").count() == 0

        await agent.section("timestamp", 1, "Now: 2026-01-01 12:00:00.")
        await client.assemble("agent-1", report=True)

        broken = chart.locator("rect.bar.break")
        await expect(broken).to_have_count(1, timeout=WAIT_MS)
        assert 'section "timestamp"' in (await broken.locator("title").text_content() or "")
        await expect(page.locator("#last-break")).to_contain_text("Now: 2026-01-01 12:00:00.")
        await expect(page.locator(".breakers")).to_contain_text('section "timestamp"')
        await screenshot(page, "cache", tmp_path)


async def test_the_cache_history_names_the_steps_each_reported_assembly_skipped(
    admin: Sidecar, page: Page
) -> None:
    def failing(name: str) -> dsp.TextProvider:
        def provide(_: dsp.AssembleContext) -> str:
            raise RuntimeError(f"{name} is down" + ("!" * 50_000 if name == "probe-3" else ""))

        return provide

    async with dsp.connect(admin.address) as client:
        agent = await client.scope("agent-1")
        await agent.section("rules", 10, "Be brief.")
        await client.assemble("agent-1", report=True)
        for index in range(5):
            name = f"probe-{index}"
            await agent.section(name, 20 + index, failing(name), failure_policy=IGNORE)
        await client.assemble("agent-1", report=True)
        await page.goto(url(admin, "/cache?scope=agent-1"))
        rows = page.locator("table.reports tbody tr")
        await expect(rows).to_have_count(2, timeout=WAIT_MS)
        newest = rows.nth(0).locator("td.skipped li")
        await expect(newest).to_have_count(5)  # four kept, and the rest counted
        assert await newest.nth(0).text_content() == (
            'section "probe-0" (scope "agent-1"): PROVIDER_FAILED: '
            'section provider "probe-0" in scope "agent-1" failed: RuntimeError: probe-0 is down'
        )
        await expect(newest.nth(4)).to_have_text("and 1 more")
        long = await newest.nth(3).text_content() or ""  # its message cut: the history is bounded
        assert long.startswith('section "probe-3"') and len(long) < 400
        assert await rows.nth(1).locator("td.skipped li").count() == 0
        skipping = page.locator("#cache-chart rect.bar").nth(1).locator("title")
        assert (await skipping.text_content() or "").endswith("; 5 skipped")


# -- scopes and sessions --------------------------------------------------------------


async def test_the_scope_tree_lists_each_scope_with_its_registrations(
    admin: Sidecar, page: Page, tmp_path: Path
) -> None:
    async with dsp.connect(admin.address, client_name="reviewer") as client:
        await client.scope("team")
        agent = await client.scope("agent-1", parent="team")
        await agent.section("memory", 20, "Remember the tea.")
        await agent.variable("model", lambda context: "deepseek-v4")
        await page.goto(url(admin, "/scopes"))
        child = page.locator('li.scope[data-scope="team"] li.scope[data-scope="agent-1"]')
        await expect(child).to_contain_text("memory", timeout=WAIT_MS)
        row = child.locator("tr.kind-section")
        await expect(row).to_contain_text("static")
        await expect(row).to_contain_text("17 bytes")
        await expect(row).to_contain_text("reviewer #")
        await expect(child.locator("tr.kind-variable")).to_contain_text("dynamic")
        assert client.session_id not in await page.content()
        await screenshot(page, "scopes", tmp_path)

        late = await client.scope("late-agent")
        await late.section("hello", 1, "Hi.")
        await expect(page.locator('li.scope[data-scope="late-agent"]')).to_contain_text("hello")


async def test_rules_are_shown_in_the_scope_tree_the_live_prompt_and_the_sessions(
    make_sidecar: SidecarFactory, page: Page
) -> None:
    """A session's scoped rule, a session's global one and an operator's rule with a scope
    pattern: each a row of its layer, a step of the scope's waterfall, a session's step."""
    operator = {"name": "team-order", "scope": "agent-*", "mutations": [{"drop_tools": "false"}]}
    admin = await make_sidecar(admin_listen="127.0.0.1:0", rules=[operator])
    async with dsp.connect(admin.address, client_name="ruler") as client:
        agent = await client.scope("agent-1")
        no_web = dsp.Mutation.drop_tools("tool.name.startsWith('web_')")
        await agent.rule("no-web", dsp.Rule([no_web], match=["true"]))
        await client.rule("quiet", dsp.Rule([dsp.Mutation.drop_contexts("true")]), global_=True)
        await page.goto(url(admin, "/scopes"))
        scoped = page.locator('li.scope[data-scope="agent-1"] tr.kind-rule')
        await expect(scoped).to_contain_text("no-web", timeout=WAIT_MS)
        await expect(scoped).to_contain_text("cel")
        await expect(scoped).to_contain_text("1 match, 1 mutation")
        await expect(scoped).to_contain_text("ruler #")
        global_ = page.locator('li.scope[data-scope=""] > table tr.kind-rule')
        await expect(global_.filter(has_text="quiet")).to_contain_text("quiet (everywhere)")
        await expect(global_.filter(has_text="team-order")).to_contain_text(
            'team-order (scopes "agent-*")'
        )
        await page.goto(url(admin, "/prompt?scope=agent-1"))
        steps = page.locator("ul.listeners li")
        await expect(steps).to_have_text(
            [
                'rule "team-order" (scopes "agent-*")',
                'rule "no-web" (scope "agent-1")',
                'rule "quiet" (everywhere)',
            ],
            timeout=WAIT_MS,
        )
        await page.goto(url(admin, "/sessions"))
        live = page.locator("#live table.sessions")
        await expect(live).to_contain_text('rule "no-web" (scope "agent-1")', timeout=WAIT_MS)
        await expect(live).to_contain_text('rule "quiet" (everywhere)')


async def test_the_sessions_view_shows_clients_and_health(
    admin: Sidecar, page: Page, tmp_path: Path
) -> None:
    async def sign(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
    ) -> dsp.PromptAssembly:
        return await next_()

    async with dsp.connect(admin.address, client_name="example-agent") as client:
        await client.context("clock", 10, lambda context: "Now.")
        await client.on_assemble(sign, name="sign")
        await client.assemble()
        await page.goto(url(admin, "/sessions"))
        live = page.locator("#live")
        await expect(live.locator("table.sessions")).to_contain_text(
            "example-agent", timeout=WAIT_MS
        )
        await expect(live).to_contain_text('listener "sign"')
        await expect(live).to_contain_text('context "clock" (global)')
        await expect(live.locator(".health")).to_contain_text("SERVING")
        await screenshot(page, "sessions", tmp_path)
    await expect(page.locator("#live")).to_contain_text("No client is connected", timeout=WAIT_MS)


async def test_the_sessions_view_counts_skipped_steps_by_kind_and_reason(
    admin: Sidecar, page: Page
) -> None:
    async def weather(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: dsp.Next
    ) -> dsp.PromptAssembly:
        raise RuntimeError("no weather today")

    async with dsp.connect(admin.address) as client:
        await client.on_assemble(weather, name="weather", failure_policy=IGNORE)
        for _ in range(3):
            await client.assemble()
        await page.goto(url(admin, "/sessions"))
        skipped = page.locator("#live table.skipped tbody tr")
        await expect(skipped).to_have_count(1, timeout=WAIT_MS)
        cells = await skipped.locator("td").all_text_contents()
        assert cells == ["listener", "LISTENER_FAILED", "3"]


# -- security -------------------------------------------------------------------------


async def test_a_request_without_the_token_is_refused(guarded: Sidecar, page: Page) -> None:
    async with dsp.connect(guarded.address, token=TOKEN) as client:
        await client.section("secret", 10, "The launch code is 1234.")
        for path in ("/prompt", "/scopes", "/events/prompt"):
            response = await page.goto(url(guarded, path))
            assert response is not None and response.status == 401, path
        assert "1234" not in await page.content()
        wrong = await page.request.get(
            url(guarded, "/prompt"), headers={"Authorization": "Bearer not-it"}
        )
        assert wrong.status == 401
        await page.goto(url(guarded, "/prompt"))
        await expect(page.locator("form input[name=token]")).to_be_visible()


async def test_the_token_signs_in_once_and_the_page_forgets_it_from_the_address(
    guarded: Sidecar, page: Page
) -> None:
    async with dsp.connect(guarded.address, token=TOKEN) as client:
        await client.section("secret", 10, "The launch code is 1234.")
        await page.goto(url(guarded, "/prompt"))
        await page.fill("input[name=token]", TOKEN)
        await page.click("form button")
        await expect(page.locator("#live")).to_contain_text("1234", timeout=WAIT_MS)
        assert TOKEN not in page.url
        cookies = await page.context.cookies()
        assert [c["httpOnly"] for c in cookies] == [True]
        assert TOKEN not in cookies[0]["value"]
        await page.goto(url(guarded, "/scopes"))
        await expect(page.locator("#live")).to_contain_text("secret")
        by_header = await page.request.get(
            url(guarded, "/prompt"), headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert by_header.status == 200


async def test_a_non_get_request_is_refused(guarded: Sidecar, page: Page) -> None:
    revision = guarded.registry.revision
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        for path in ("/prompt", "/events/prompt", "/nowhere"):
            response = await page.request.fetch(
                url(guarded, path),
                method=method,
                headers={"Authorization": f"Bearer {TOKEN}"},
                data="name=x",
            )
            assert response.status == 405, f"{method} {path}"
            assert response.headers["allow"] == "GET,HEAD"
    assert guarded.registry.revision == revision


async def test_a_page_reached_by_another_host_name_is_refused(admin: Sidecar) -> None:
    # A web page that points its own name at 127.0.0.1 (DNS rebinding) sends its Host.
    assert admin.admin is not None
    host, _, port = admin.admin.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /prompt HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n")
    await writer.drain()
    status = await reader.readline()
    writer.close()
    assert status.split()[1] == b"403"


async def test_the_admin_page_is_off_by_default(sidecar: Sidecar) -> None:
    assert sidecar.admin is None


def test_admin_listen_must_be_loopback_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="not a loopback address"):
        parse_config({"admin_listen": "0.0.0.0:8080"})
    assert parse_config({"admin_listen": "[::1]:8080"}).admin_listen == "[::1]:8080"


def test_a_remote_admin_page_needs_the_token() -> None:
    with pytest.raises(ConfigError, match="admin_allow_remote' needs 'auth_token_file'"):
        parse_config({"admin_listen": "0.0.0.0:8080", "admin_allow_remote": True})


async def test_a_closed_page_ends_its_live_view(admin: Sidecar, browser: Browser) -> None:
    watchers = admin.registry.changes.subscriber_count
    context = await browser.new_context()
    opened = await context.new_page()
    await opened.goto(url(admin, "/scopes"))
    await eventually(lambda: watchers() == 1, "the live view subscribed")
    await context.close()
    await eventually(lambda: watchers() == 0, "the live view ended with its page")
