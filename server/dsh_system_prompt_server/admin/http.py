"""The admin page's HTTP server: aiohttp in the sidecar's event loop, beside grpc.aio.

Read-only by construction: only GET and HEAD are routed, anything else is 405
before a handler runs, and no handler calls anything that changes the registry.
With credentials configured, every page asks for an admin's or a reader's token:
`Authorization: Bearer <token>`, or the cookie signing in sets (sign_in.py); a
reader sees the Prompt and Cache views only with `values`, and every view, query parameter
and picker only within its scopes (reach.py). A live view ends once its credential may no
longer see it (a reload removed or narrowed it).
Unless `admin_allow_remote`, only loopback Host names are served (a web page
that rebinds its own name to 127.0.0.1 still cannot read this one).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from yarl import URL

from ..guard import ADMIN, Authenticator, Credential, Role
from ..registry import ChangeEvent
from ..rpc import ServerState
from ..telemetry import logger
from ..wire import is_loopback
from . import sign_in, views
from .live import Live, LiveViews
from .live_prompt import PromptWatcher
from .paging import page_of
from .reach import Reach
from .render import render
from .sign_in import SignIn

READ_ONLY = ("GET", "HEAD")
VIEWS = ("scopes", "prompt", "cache", "sessions")
PAGES = frozenset({"/", *(f"/{view}" for view in VIEWS)})
CREDENTIAL = web.RequestKey("credential", Credential)  # the signed-in credential
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
    authenticator: Authenticator | None = None  # the sidecar's credentials: pages ask for one
    tls: ssl.SSLContext | None = None  # the sidecar's certificate, when it serves TLS
    allow_remote: bool = False  # else only loopback Host names are served
    request_timeout_s: float = 5.0  # a connection with no whole request head by then is closed


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
    host, tls = options.host, options.tls
    closing = asyncio.Event()
    runner, bound = await _listen(
        host,
        options.port,
        tls,
        lambda bound: make_app(
            state,
            grpc_address,
            _sign_in(options.authenticator, state, bound, tls is not None),
            options.allow_remote,
            closing,
        ),
        options.request_timeout_s,
    )
    address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
    url = f"{'https' if tls else 'http'}://{address}/"
    _log.info("admin page on %s (auth=%s)", url, options.authenticator is not None)
    return AdminServer(runner, address, url, closing)


async def _listen(
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    app: Callable[[int], web.Application],
    request_timeout_s: float,
) -> tuple[web.AppRunner, int]:
    """Bind first (the sign-in cookie is bound to the port, 0 asks for any), then serve."""
    sock = socket.create_server((host, port), family=_family(host), reuse_port=False)
    bound = int(sock.getsockname()[1])
    # aiohttp's keep-alive timer starts with the connection and closes it while no whole
    # request head has come: the deadline of a half-sent request (and of an idle one).
    runner = web.AppRunner(
        app(bound),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        keepalive_timeout=request_timeout_s,
    )
    await runner.setup()
    try:
        await web.SockSite(runner, sock, ssl_context=tls).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner, bound


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _sign_in(
    authenticator: Authenticator | None, state: ServerState, port: int, secure: bool
) -> SignIn | None:
    if authenticator is None:
        return None
    return SignIn(authenticator, state.watches.incarnation, port, secure)


def make_app(
    state: ServerState,
    grpc_address: str,
    signing: SignIn | None,
    allow_remote: bool,
    closing: asyncio.Event,
) -> web.Application:
    """The admin page's routes behind its guard (methods, Host, credential)."""
    pages = Pages(state, grpc_address, closing, signing)
    app = web.Application(middlewares=[_guard(signing, allow_remote)], client_max_size=1024)
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


# -- the guard: methods, Host, credential ---------------------------------------------


def _guard(signing: SignIn | None, allow_remote: bool) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in READ_ONLY:
            raise web.HTTPMethodNotAllowed(
                request.method, READ_ONLY, text="the admin page is read-only: GET and HEAD only\n"
            )
        if not allow_remote and not is_loopback(_host_name(request.host)):
            raise web.HTTPForbidden(text="the admin page answers only to loopback host names\n")
        if signing is None:
            request[CREDENTIAL] = ADMIN
            return await handler(request)
        if request.path.startswith("/static/"):
            return await handler(request)
        return await _signed_in(request, handler, signing)

    return guard


async def _signed_in(request: web.Request, handler: Handler, signing: SignIn) -> web.StreamResponse:
    """The page for a request that presents a credential (header or cookie); else the
    sign-in form. A token (the form's, at /sign-in, or `?token=` on a page) sets the
    cookie and redirects to one of the page's own paths, without it."""
    given = request.query.get("token")
    if request.path == sign_in.PATH or given is not None:
        if request.path == sign_in.PATH:
            goal = sign_in.next_of(request.query.get("next", ""), PAGES)
        else:
            goal = sign_in.target(request.path, request.query, PAGES)
        redirect = signing.signed_in(given or "", goal)
        if redirect is None:
            return _login(goal, "That token is not one of the sidecar's credentials.")
        raise redirect
    credential = signing.credential(request)
    if credential is None:
        if request.path.startswith("/events/"):
            return web.Response(status=401, text="sign in on the page first\n")
        return _login(sign_in.target(request.path, request.query, PAGES), "")
    if credential.role is Role.AGENT:
        raise web.HTTPForbidden(
            text=f"{credential.describe()}: the admin page is for admin and reader credentials\n"
        )
    request[CREDENTIAL] = credential
    return await handler(request)


def _login(goal: str, problem: str) -> web.Response:
    html = render("login.html", problem=problem, action=sign_in.PATH, next=goal)
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
    """The page of each view, and its live stream of updates (live.py)."""

    def __init__(
        self,
        state: ServerState,
        grpc_address: str,
        closing: asyncio.Event,
        signing: SignIn | None = None,
    ) -> None:
        self._state = state
        self._signing = signing
        self._address = grpc_address
        self._started = time.time()
        self._live_views = LiveViews(state.registry.changes.subscribe, closing)

    async def home(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(location="/scopes")

    async def page(self, request: web.Request) -> web.StreamResponse:
        view = request.path.strip("/")
        reach = _check_view(request, view)
        _, fragment = await self._live_views.fragment(self._live(view, request.query, reach))
        events = URL.build(path=f"/events/{view}", query=request.query)
        html = render(
            "page.html",
            view=view,
            views=VIEWS,
            fragment=fragment,
            events=str(events),
            controls=self._controls(view, request.query, reach),
        )
        return web.Response(text=html, content_type="text/html")

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: the view's fragment again whenever it changed."""
        view = request.match_info["view"]
        if view not in VIEWS:
            raise web.HTTPNotFound()
        live = self._live(view, request.query, _check_view(request, view))
        client = (request.remote, request[CREDENTIAL].name)  # one browser, or one script
        if request.method == "HEAD":
            self._live_views.admit(client)
            return web.Response(content_type="text/event-stream")
        opened = request[CREDENTIAL]
        return await self._live_views.serve(
            request, live, client, lambda: self._still(request, opened)
        )

    def _still(self, request: web.Request, opened: Credential) -> bool:
        """Whether the request's credential, as the credentials are now, may still see the
        view it opened (a reload may have removed or narrowed it), as it was rendered for
        `opened`: a Scopes view is never refused, but one narrowed credential's is filtered
        otherwise (the browser's EventSource then opens it again, filtered anew)."""
        if self._signing is None:
            return True
        credential = self._signing.credential(request)
        if credential is None or credential.role is Role.AGENT:
            return False
        if Reach(credential).key != Reach(opened).key:
            return False
        view = request.match_info["view"]
        query = request.query
        return Reach(credential).denial(view, query.get("scope") or None, query.get("key")) is None

    def _live(self, view: str, query: Any, reach: Reach) -> Live:
        state = self._state
        if view == "prompt":
            return self._prompt(_scope(state, query), reach.names)
        if view == "cache":
            key = views.cache_key(_scope(state, query), _bounded(state, query.get("key")))

            async def cache() -> tuple[str, dict[str, Any]]:
                return "cache.html", {"data": views.cache_view(state, key, reach.names)}

            by_reach = ("cache", key, reach.key)  # its skipped steps are named by reach
            return Live(lambda: state.reports.version, cache, _never, by_reach)
        if view == "sessions":

            async def sessions() -> tuple[str, dict[str, Any]]:
                data = views.sessions_view(state, self._address, self._started)
                return "sessions.html", {"data": data}

            registry = state.registry
            return Live(
                lambda: (registry.revision, len(state.sessions), state.reports.version),
                sessions,
                shared=("sessions",),
            )
        number = _page_number(query.get("page"))

        async def scopes() -> tuple[str, dict[str, Any]]:
            shown = views.scopes_view(state, reach.scope, reach.names)
            return "scopes.html", {"page": page_of(shown, number)}

        shared = ("scopes", number, reach.key)
        return Live(lambda: state.registry.revision, scopes, shared=shared)

    def _prompt(self, scope: str | None, names: views.Names | None) -> Live:
        """The Prompt view: its own watcher, and only the changes of the scope's chain; the
        steps held in a layer `names` does not name (None: every layer's) unnamed."""
        watcher = PromptWatcher(self._state, scope, names)
        registry = self._state.registry

        async def prompt() -> tuple[str, dict[str, Any]]:
            return "prompt.html", {"data": await watcher.view()}

        def concerns(event: ChangeEvent) -> bool:
            if event.scope is None or scope is None:
                return True  # the global layer, or a config key: in every prompt
            return event.scope in registry.scope_chain(scope) or event.name == scope

        return Live(lambda: 0, prompt, concerns)

    def _controls(self, view: str, query: Any, reach: Reach) -> dict[str, Any]:
        """The pickers above a view: which scope, which report key (those it reaches)."""
        state = self._state
        if view == "prompt":
            scopes = ["", *sorted(filter(reach.scope, state.registry.scope_keys()))]
            return {"scopes": scopes, "scope": query.get("scope", "")}
        if view == "cache":
            keys = [
                (k.describe(), k.kind, k.name or "")
                for k in state.reports.history_keys()
                if reach.history(k)
            ]
            return {
                "keys": keys[::-1],
                "scope": query.get("scope", ""),
                "key": query.get("key", ""),
            }
        return {}


def _never(event: ChangeEvent) -> bool:
    return False  # the cache history changes with reports, not registrations


def _page_number(value: str | None) -> int:
    return int(value) if value and value.isdigit() and len(value) < 10 else 1


def _check_view(request: web.Request, view: str) -> Reach:
    """The request's credential's reach; 403 when it may not see the view (of the scope or
    report key it asks for)."""
    reach = Reach(request[CREDENTIAL])
    query = request.query
    denial = reach.denial(view, query.get("scope") or None, query.get("key"))
    if denial is not None:
        raise web.HTTPForbidden(text=denial + "\n")
    return reach


def _scope(state: ServerState, query: Any) -> str | None:
    return _bounded(state, query.get("scope")) or None


def _bounded(state: ServerState, value: str | None) -> str | None:
    limit = state.registry.limits.max_name_bytes
    if value is not None and len(value.encode()) > limit:
        raise web.HTTPBadRequest(text=f"a scope or report key is at most {limit} bytes\n")
    return value
