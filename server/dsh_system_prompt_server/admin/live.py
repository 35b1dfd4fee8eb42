"""Live views: a view's fragment sent again (server-sent events) when it may have changed.

Off the gRPC loop's critical path: a view's data is a snapshot of plain values
taken on the loop, and its template is rendered from it in a worker thread; views
that show the same thing (the same view and query) share one render per version;
a view renders at most once per `RENDER_EVERY_S`, so a burst of changes is one
render; a view that follows one scope renders only for changes of that scope's
chain (or the global layer). Bounded: `MAX_STREAMS` at once, `MAX_PER_CLIENT` per
client (its address and credential), each ended after `LIVE_VIEW_S` (the page says
so and resumes on a click), and after `WRITE_S` without taking data.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..registry import ChangeEvent, Missed, Subscription
from .render import render

MAX_STREAMS = 16  # live views open at once; more is 503 (each holds a change subscription)
MAX_PER_CLIENT = 4  # so that one client cannot hold them all
LIVE_VIEW_S = 600.0  # then the view ends; the page offers to resume
RENDER_EVERY_S = 1.0  # at most one render per view per second: a burst is one render
TICK_S = 0.5  # how often a live view looks for news besides registry changes
KEEPALIVE_S = 15.0  # a comment line on a quiet stream, so a closed page is noticed
SUBSCRIPTION_BUFFER = 64  # events; a gap only means "render again"
WRITE_S = 10.0  # a live view whose page takes no data for this long is ended
SHARED_RENDERS = 32  # fragments kept for views that show the same thing


def _every(event: ChangeEvent) -> bool:
    return True


@dataclass
class Live:
    """A view: what version it shows, the template and data of its fragment (a snapshot,
    taken on the loop), which changes concern it, and what views share its render."""

    version: Callable[[], Hashable]
    snapshot: Callable[[], Awaitable[tuple[str, dict[str, Any]]]]
    concerns: Callable[[ChangeEvent], bool] = _every
    shared: Hashable | None = None  # None: its own (it keeps state between renders)


@dataclass(frozen=True)
class _Render:
    """A shared render: of which version, started when, and its fragment."""

    version: Hashable
    at: float
    html: asyncio.Future[str]


@dataclass
class _Seen:
    """The last change that concerned a view (its revision), and a flag to wake it."""

    revision: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class LiveViews:
    """Every live view of the page: their bounds, their streams, their renders."""

    def __init__(self, subscribe: Callable[[int], Subscription], closing: asyncio.Event) -> None:
        self._subscribe = subscribe
        self._closing = closing
        self._open = 0
        self._per_client: collections.Counter[Hashable] = collections.Counter()
        self._renders: collections.OrderedDict[Hashable, _Render] = collections.OrderedDict()

    async def fragment(self, live: Live) -> tuple[Hashable, str]:
        """The view's fragment, rendered in a worker thread, and the version it shows: a
        shared view takes the render of its kind when it is of its version or younger than
        `RENDER_EVERY_S` (changing all the time, it is rendered once a second, not per view)."""
        version = live.version()
        if live.shared is None:
            return version, await self._rendered(live)
        kept = self._renders.get(live.shared)
        now = time.monotonic()
        if kept is None or (kept.version != version and now - kept.at >= RENDER_EVERY_S):
            kept = _Render(version, now, asyncio.ensure_future(self._rendered(live)))
            self._renders[live.shared] = kept
            self._renders.move_to_end(live.shared)
            while len(self._renders) > SHARED_RENDERS:
                self._renders.popitem(last=False)
        return kept.version, await asyncio.shield(kept.html)

    async def _rendered(self, live: Live) -> str:
        template, data = await live.snapshot()
        return await asyncio.to_thread(render, template, **data)

    def admit(self, client: Hashable) -> None:
        """Refuse (503) a view over the bounds."""
        if self._open >= MAX_STREAMS:
            raise web.HTTPServiceUnavailable(text=f"{MAX_STREAMS} live views open already\n")
        if self._per_client[client] >= MAX_PER_CLIENT:
            raise web.HTTPServiceUnavailable(
                text=f"this client has {MAX_PER_CLIENT} live views open already\n"
            )

    async def serve(
        self,
        request: web.Request,
        live: Live,
        client: Hashable,
        still: Callable[[], bool] = lambda: True,
    ) -> web.StreamResponse:
        """Server-sent events: the view's fragment again whenever it changed, while `still`
        says its credential may see it (else it ends, `event: revoked`)."""
        self.admit(client)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self._open += 1
        self._per_client[client] += 1
        subscription = self._subscribe(SUBSCRIPTION_BUFFER)
        seen = _Seen()
        follower = asyncio.create_task(_follow(subscription, live.concerns, seen))
        try:
            await response.prepare(request)
            await self._stream(request, live, response, seen, still)
        except (ConnectionError, TimeoutError):
            pass  # the page went away, or stopped reading
        finally:
            follower.cancel()
            subscription.close()
            self._open -= 1
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]
        return response

    async def _stream(
        self,
        request: web.Request,
        live: Live,
        response: web.StreamResponse,
        seen: _Seen,
        still: Callable[[], bool],
    ) -> None:
        """Send the view whenever it changed, until the page or the sidecar goes away, or
        its credential may no longer see it (looked at each `TICK_S`)."""
        sent: Hashable = object()
        last_html = ""
        started = quiet_since = time.monotonic()
        rendered_at = -RENDER_EVERY_S
        while not self._closing.is_set():
            if request.transport is None or request.transport.is_closing():
                return
            if not still():
                await _send(response, b"event: revoked\ndata: \n\n")
                return
            if time.monotonic() - started > LIVE_VIEW_S:
                await _send(response, b"event: idle\ndata: \n\n")
                return
            seen.changed.clear()
            if (live.version(), seen.revision) != sent:
                await asyncio.sleep(max(0.0, rendered_at + RENDER_EVERY_S - time.monotonic()))
                revision = seen.revision
                version, html = await self.fragment(live)
                sent = (version, revision)  # a shared render may show an older version
                rendered_at = time.monotonic()
                if html != last_html:
                    last_html = html
                    await _send(response, _event(html))
                    quiet_since = time.monotonic()
            if time.monotonic() - quiet_since > KEEPALIVE_S:
                await _send(response, b": keepalive\n\n")
                quiet_since = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(seen.changed.wait(), TICK_S)


async def _follow(
    subscription: Subscription, concerns: Callable[[ChangeEvent], bool], seen: _Seen
) -> None:
    """Note every change event that concerns the view (a gap counts: it renders anew)."""
    while True:
        event = await subscription.next()
        if isinstance(event, Missed) or concerns(event):
            seen.revision = event.resync_revision if isinstance(event, Missed) else event.revision
            seen.changed.set()


async def _send(response: web.StreamResponse, data: bytes) -> None:
    async with asyncio.timeout(WRITE_S):  # a page that stops reading costs one slot, briefly
        await response.write(data)


def _event(html: str) -> bytes:
    data = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: update\n{data}\n".encode()
