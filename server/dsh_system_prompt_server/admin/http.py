"""The admin page's HTTP server: aiohttp in the sidecar's event loop, beside grpc.aio.

Read-only by construction: only GET and HEAD are routed, anything else is 405
before a handler runs, and no handler calls anything that changes the registry.
With `auth_token_file`, every page asks for the token: `Authorization: Bearer
<token>`, or a cookie the page sets after one visit with `?token=<token>`.
Unless `admin_allow_remote`, only loopback Host names are served (a web page
that rebinds its own name to 127.0.0.1 still cannot read this one).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ssl
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web
from aiohttp.typedefs import Middleware
from yarl import URL

from ..registry import Subscription
from ..rpc.addresses import is_loopback
from ..rpc.state import ServerState
from ..telemetry.logs import logger
from . import views
from .live_prompt import PromptWatcher

COOKIE = "dsp_admin"
MAX_STREAMS = 16  # live views open at once; more is 503 (each holds a change subscription)
TICK_S = 0.5  # how often a live view looks for news besides registry changes
KEEPALIVE_S = 15.0  # a comment line on a quiet stream, so a closed page is noticed
SUBSCRIPTION_BUFFER = 64  # events; a gap only means "render again"
WRITE_S = 10.0  # a live view whose page takes no data for this long is ended
READ_ONLY = ("GET", "HEAD")
VIEWS = ("scopes", "prompt", "cache", "sessions")
_HERE = Path(__file__).parent
_log = logger("admin")

# Everything the page loads comes from the sidecar; nothing inline runs.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
        " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class AdminOptions:
    """Where and how the page serves, as the sidecar's config says."""

    host: str
    port: int  # 0 for any free port
    token: str | None = None  # the sidecar's bearer token: every page asks for it
    tls: ssl.SSLContext | None = None  # the sidecar's certificate, when it serves TLS
    allow_remote: bool = False  # else only loopback Host names are served


@dataclass
class AdminServer:
    """The running admin page: where it listens, and how to stop it."""

    runner: web.AppRunner
    address: str
    url: str
    closing: asyncio.Event

    async def close(self) -> None:
        """End the live views, then stop serving."""
        self.closing.set()
        await self.runner.cleanup()


async def start_admin(state: ServerState, options: AdminOptions, grpc_address: str) -> AdminServer:
    """Serve the admin page as `options` say; OSError when it cannot listen."""
    host, token, tls = options.host, options.token, options.tls
    closing = asyncio.Event()
    app = make_app(state, grpc_address, token, options.allow_remote, closing, tls is not None)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, options.port, ssl_context=tls)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
    url = f"{'https' if tls else 'http'}://{address}/"
    _log.info("admin page on %s (auth=%s)", url, token is not None)
    return AdminServer(runner, address, url, closing)


def make_app(
    state: ServerState,
    grpc_address: str,
    token: str | None,
    allow_remote: bool,
    closing: asyncio.Event,
    secure: bool = False,
) -> web.Application:
    """The admin page's routes behind its guard (methods, Host, token)."""
    pages = Pages(state, grpc_address, closing)
    app = web.Application(middlewares=[_guard(token, allow_remote, secure)], client_max_size=1024)
    app.router.add_get("/", pages.home)
    for view in VIEWS:
        app.router.add_get(f"/{view}", pages.page)
    app.router.add_get("/events/{view}", pages.events)
    app.router.add_get("/favicon.ico", _no_icon)
    app.router.add_static("/static/", _HERE / "static", append_version=False)
    app.on_response_prepare.append(_add_security_headers)
    return app


async def _no_icon(request: web.Request) -> web.StreamResponse:
    return web.Response(status=204)


# -- the guard: methods, Host, token --------------------------------------------------


def _guard(token: str | None, allow_remote: bool, secure: bool) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in READ_ONLY:
            raise web.HTTPMethodNotAllowed(
                request.method, READ_ONLY, text="the admin page is read-only: GET and HEAD only\n"
            )
        if not allow_remote and not is_loopback(_host_name(request.host)):
            raise web.HTTPForbidden(text="the admin page answers only to loopback host names\n")
        if token is None or request.path.startswith("/static/"):
            return await handler(request)
        return await _signed_in(request, handler, token, secure)

    return guard


async def _signed_in(
    request: web.Request, handler: Handler, token: str, secure: bool
) -> web.StreamResponse:
    """The page for a request that shows the token (header or cookie); else the sign-in
    form. `?token=` sets the cookie and redirects to the address without it."""
    cookie = _cookie_value(token)
    given = request.query.get("token")
    if given is not None:
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _login(request, "That token is not the sidecar's.")
        target = request.rel_url.with_query(
            {name: value for name, value in request.query.items() if name != "token"}
        )
        redirect = web.HTTPSeeOther(location=str(target))
        redirect.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict", secure=secure)
        raise redirect
    if _authorized(request, token, cookie):
        return await handler(request)
    return _login(request, "")


def _cookie_value(token: str) -> str:
    # Not the token itself: a leaked cookie opens this page, never the gRPC API.
    return hmac.new(token.encode(), b"dsh-system-prompt admin page", hashlib.sha256).hexdigest()


def _authorized(request: web.Request, token: str, cookie: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return True
    return hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), cookie.encode())


def _login(request: web.Request, problem: str) -> web.Response:
    if request.path.startswith("/events/"):
        return web.Response(status=401, text="sign in on the page first\n")
    html = render("login.html", problem=problem, action=request.path, query=request.query)
    return web.Response(
        status=401,
        text=html,
        content_type="text/html",
        headers={"WWW-Authenticate": 'Bearer realm="dsh-system-prompt admin"'},
    )


def _host_name(host: str | None) -> str:
    """The name in a Host header, without port or brackets."""
    if not host:
        return ""
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


# -- pages and live views -------------------------------------------------------------


class Pages:
    """The page of each view, and its live stream of updates."""

    def __init__(self, state: ServerState, grpc_address: str, closing: asyncio.Event) -> None:
        self._state = state
        self._address = grpc_address
        self._closing = closing
        self._started = time.time()
        self._streams = 0

    async def home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location="/scopes")

    async def page(self, request: web.Request) -> web.StreamResponse:
        view = request.path.strip("/")
        live = self._live(view, request.query)
        fragment = await live.render()
        events = URL.build(path=f"/events/{view}", query=request.query)
        html = render(
            "page.html",
            view=view,
            views=VIEWS,
            fragment=fragment,
            events=str(events),
            controls=self._controls(view, request.query),
        )
        return web.Response(text=html, content_type="text/html")

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the view's fragment again whenever it changed."""
        view = request.match_info["view"]
        if view not in VIEWS:
            raise web.HTTPNotFound()
        if self._streams >= MAX_STREAMS:
            raise web.HTTPServiceUnavailable(text=f"{MAX_STREAMS} live views open already\n")
        live = self._live(view, request.query)
        if request.method == "HEAD":
            return web.Response(content_type="text/event-stream")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self._streams += 1
        subscription = self._state.registry.changes.subscribe(SUBSCRIPTION_BUFFER)
        changed = asyncio.Event()
        follower = asyncio.create_task(_follow(subscription, changed))
        try:
            await response.prepare(request)
            await self._stream(request, live, response, changed)
        except (ConnectionError, TimeoutError):
            pass  # the page went away, or stopped reading
        finally:
            follower.cancel()
            subscription.close()
            self._streams -= 1
        return response

    async def _stream(
        self, request: web.Request, live: Live, response: web.StreamResponse, changed: asyncio.Event
    ) -> None:
        """Send the view whenever it changed, until the page or the sidecar goes away."""
        sent: Hashable = object()
        last_html = ""
        quiet_since = time.monotonic()
        while not self._closing.is_set():
            if request.transport is None or request.transport.is_closing():
                return
            changed.clear()
            version = live.version()
            if version != sent:
                sent = version
                html = await live.render()
                if html != last_html:
                    last_html = html
                    await _send(response, _event(html))
                    quiet_since = time.monotonic()
            if time.monotonic() - quiet_since > KEEPALIVE_S:
                await _send(response, b": keepalive\n\n")
                quiet_since = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), TICK_S)

    def _live(self, view: str, query: Any) -> Live:
        state = self._state
        if view == "prompt":
            watcher = PromptWatcher(state, _scope(state, query))

            async def prompt() -> str:
                return render("prompt.html", data=await watcher.view())

            return Live(watcher.version, prompt)
        if view == "cache":
            key = views.cache_key(_scope(state, query), _bounded(state, query.get("key")))

            async def cache() -> str:
                return render("cache.html", data=views.cache_view(state, key))

            return Live(lambda: state.reports.version, cache)
        if view == "sessions":

            async def sessions() -> str:
                data = views.sessions_view(state, self._address, self._started)
                return render("sessions.html", data=data)

            registry = state.registry
            return Live(
                lambda: (registry.revision, len(state.sessions), state.reports.version),
                sessions,
            )

        async def scopes() -> str:
            return render("scopes.html", data=views.scopes_view(state))

        return Live(lambda: state.registry.revision, scopes)

    def _controls(self, view: str, query: Any) -> dict[str, Any]:
        """The pickers above a view: which scope, which report key."""
        state = self._state
        if view == "prompt":
            scopes = ["", *sorted(state.registry.scope_keys())]
            return {"scopes": scopes, "scope": query.get("scope", "")}
        if view == "cache":
            keys = [(k.describe(), k.kind, k.name or "") for k in state.reports.history_keys()]
            return {
                "keys": keys[::-1],
                "scope": query.get("scope", ""),
                "key": query.get("key", ""),
            }
        return {}


@dataclass
class Live:
    """A view that can say cheaply whether it may have changed, and render itself."""

    version: Callable[[], Hashable]
    render: Callable[[], Awaitable[str]]


def _scope(state: ServerState, query: Any) -> str | None:
    return _bounded(state, query.get("scope")) or None


def _bounded(state: ServerState, value: str | None) -> str | None:
    limit = state.registry.limits.max_name_bytes
    if value is not None and len(value.encode()) > limit:
        raise web.HTTPBadRequest(text=f"a scope or report key is at most {limit} bytes\n")
    return value


async def _follow(subscription: Subscription, changed: asyncio.Event) -> None:
    """Set `changed` at every change event (a gap counts too: the view renders anew)."""
    while True:
        await subscription.next()
        changed.set()


async def _send(response: web.StreamResponse, data: bytes) -> None:
    async with asyncio.timeout(WRITE_S):  # a page that stops reading costs one slot, briefly
        await response.write(data)


def _event(html: str) -> bytes:
    data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: update\n{data}\n".encode()


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(_HERE / "templates"),
    autoescape=True,  # every name and text on the page comes from a client
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def render(template: str, **values: Any) -> str:
    return _templates.get_template(template).render(**values)
