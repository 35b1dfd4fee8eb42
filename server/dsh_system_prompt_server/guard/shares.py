"""Each client's share of the event loop: the time its calls and writes take is measured,
and when the loop is busy, a client using more than an equal share waits before its next
call or write until its use is back to that share.

One event loop serves every client, and a step of one call runs to its end before
anything else does: a few clients sending the costliest requests the bounds allow
(the largest fields, 3.5 MiB scopes, hundreds of watchers) kept it busy enough to
make everyone else's assemblies six times slower (issue 22). As Kubernetes' API
priority and fairness queues each user's requests apart and serves them in turn
(fair queuing: every client with work waiting gets an equal share), and as Envoy's
overload manager acts only past a threshold, nothing waits while the loop has time
to spare: it runs late by less than `fair_share.lag_s` (a timer's lateness says both
that work is queued and that the process is short of CPU) and its thread is busy less
than `fair_share.busy` of the time (gRPC queues a flood's calls in its core, so a loop it
keeps full on a host with CPU to spare runs its timers on time); when it has not,
the time the clients' calls take is split equally among the clients that use it,
and one more than 1.25 times over its split waits, its waiting calls let go one at a
time, first come first. What a call costs is its steps' time plus what gRPC does
around them, which no step sees (charging.py meters them). A client is one told
apart by its credential or its address (`share_key`): over loopback or a unix socket
without credentials nobody waits for anyone. Once credentials are configured, every call
is charged: one that presents none (or a wrong one), health's and reflection's too, to
`ANONYMOUS` and its address over TCP, else to `ANONYMOUS` alone, each with a quarter of a
credentialed client's split, so a flood of them waits its turn like any client's calls
(issue 34: it had made a credentialed client's Assembles up to 24 times slower, with no
wait).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
import types
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..config import Number, Seconds, setting
from ..registry import Client
from .clients import CREDENTIALED, IDENTIFIED
from .running import Running
from .use import Use

T = TypeVar("T")
# Once credentials are configured, the key of the calls that present no valid credential
# (health's and reflection's among them), by itself over loopback or a unix socket (a flood
# opening connection after connection is still one client), before the address's over TCP.
ANONYMOUS = "anonymous:"


@dataclass(frozen=True)
class ShareSettings:
    """When shares apply and how use is measured: config table [fair_share], and the
    scheduler's own tuning (`beat_s`, `refresh_s`, `idle`), which is no config key."""

    # Lateness as well as the calls' time (`busy`): what the calls cost is an estimate
    # (CALL_S, MESSAGE_S), and a process short of CPU runs late with its thread three
    # quarters busy. In the hostile soak the loop ran 1-6 ms late, calm or not, and shares held
    # at 0.5 ms kept the calm agents' p99 within 1.5x of a calm run, against 3.2x at 2 ms.
    lag_s: float = setting(
        0.0005,
        Seconds(most=1.0, zero="never"),
        "when the event loop runs later than this (a timer's lateness, averaged over"
        " `window_s`), the time the clients' calls take is split equally among them and a"
        " client more than `over` times over its split waits (Fair shares of the event loop)",
        was="fair_share_lag_s",
    )
    # Its thread's use, too: on a host with CPU to spare a flood keeps the loop's thread
    # full while its timers run on time (0.13-0.29 ms late under a flood of refused calls that
    # made a credentialed client's Assembles 13 times slower; 0.5-0.6 ms calm), as gRPC
    # queues the calls in its core, not in the loop. Near what it reaches when full, not at
    # half: a loop with time to spare holds nobody (at half, a lone busy agent beside an
    # idle one would wait). Full is 0.72-0.84 under a flood, the rest being gRPC's threads':
    # at 0.9 shares never applied and a wrong-token flood made others 13.8 times slower.
    busy: float = setting(
        0.7,
        Number(0.0, 1.0),
        "shares apply also while the event loop's thread is busy this much of the time (its"
        " CPU time over the time passed, averaged over `window_s`); 0: never",
    )
    over: float = setting(
        1.25,
        Number(1.0, 100.0),
        "how far past its split a client's use may go before its next call or watch write waits",
    )
    floor: float = setting(
        0.5,
        Number(0.0, 1.0),
        "a split is at least this much of a whole loop split equally, so a busy client is not"
        " held to the quiet ones' use while the host is short of CPU",
    )
    # As Kubernetes' API priority and fairness gives its catch-all level (every request that
    # no other flow schema matches, unauthenticated ones among them) a small share of seats.
    anonymous: float = setting(
        0.25,
        Number(0.01, 1.0),
        "the split of the calls that present no valid credential while credentials are"
        " configured (one share over loopback, one per address over TCP), as a fraction of a"
        " credentialed client's",
    )
    max_wait_s: float = setting(
        2.0, Seconds(most=60.0), "how long a call or write waits at most before it goes in turn"
    )
    window_s: float = setting(
        0.5,
        Seconds(most=60.0),
        "how fast a client's measured use forgets (its decay's time), and the loop's lateness"
        " and its thread's busy time are averaged over",
    )
    beat_s: float = 0.025  # how often the loop's lateness and its thread's time are measured
    refresh_s: float = 0.1  # how often the fair share is recomputed from everyone's use
    idle: float = 1e-5  # a client using less than this (10 µs a second) is forgotten


_Waiters = collections.deque[tuple[float, asyncio.Future[None]]]


@dataclass
class _Line:
    """One client's calls and writes waiting for its turn, first come first: those of its
    calls already running (their next message, a write) before new calls."""

    going: _Waiters = field(default_factory=collections.deque)  # of calls already running
    new: _Waiters = field(default_factory=collections.deque)  # calls to start
    handle: asyncio.Handle | None = None  # when the first one is looked at next

    def first(self) -> tuple[_Waiters, bool] | None:
        """The waiters looked at next, and whether they are new calls; None: nobody waits."""
        for waiters in (self.going, self.new):
            while waiters and waiters[0][1].done():  # cancelled while it waited
                waiters.popleft()
        if self.going:
            return self.going, False
        return (self.new, True) if self.new else None

    def all(self) -> list[asyncio.Future[None]]:
        return [waiter for _, waiter in (*self.going, *self.new)]


class Shares:
    """The clients' use of the loop, and the fair share past which one waits. `clock` is
    the running loop's (waits are timed with its `call_later`), or a test's that never
    waits; `cpu`, the loop's thread's CPU time."""

    def __init__(
        self,
        settings: ShareSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.settings = settings or ShareSettings()
        self._clock = clock
        self._cpu = cpu
        self._uses: dict[str, Use] = {}
        self._running = Running()  # each client's calls started and not ended
        self._waited: dict[str, int] = {}  # how often each client waited, while it is seen
        self._lines: dict[str, _Line] = {}  # the calls of each client waiting for its turn
        self._total = Use()
        self._fair = math.inf  # the share above which a client waits; inf: nobody waits
        self._refreshed = 0.0
        self._lag = 0.0  # how late the loop ran lately, seconds
        self._busy = 0.0  # how much of the time the loop's thread was busy lately
        self._cpu_at = 0.0  # the loop's thread's CPU time at the last beat
        self._busy_at = -math.inf  # when it last ran late, or its thread was `busy` that much
        self._beat: asyncio.TimerHandle | None = None
        self._charged = False  # a call or message was charged since the last beat
        self._quiet_at = 0.0  # when the last beat found nothing charged (the loop's time)
        self.beats = 0  # the heartbeats so far: none while no call is in flight
        self.running = False  # started and not stopped: the sidecar is serving
        self.on_wait: Callable[[], None] = lambda: None  # a call or write waits (the metrics)

    def charge(self, key: str | None, seconds: float) -> None:
        """Count `seconds` of the loop's time against the client `key` (None: nobody)."""
        if key is None:
            return
        now = self._clock()
        window = self.settings.window_s
        use = self._uses.get(key)
        if use is None:
            use = self._uses[key] = Use()
        use.add(now, window, seconds)
        self._total.add(now, window, seconds)
        self._charged = True
        if self._beat is None and self.running:
            self._beat_again()
        if now - self._refreshed >= self.settings.refresh_s:
            self._refresh(now)

    def use(self, key: str) -> float:
        """The share of the loop `key` took lately (0 for a client not seen)."""
        use = self._uses.get(key)
        return 0.0 if use is None else use.now(self._clock(), self.settings.window_s)

    def waits_of(self, key: str) -> int:
        """How often `key`'s calls and writes waited for its share since it was last idle."""
        return self._waited.get(key, 0)

    def fair_share(self) -> float:
        """The share of the loop above which a client waits now (inf when nobody does)."""
        return self._fair

    def wait_s(self, key: str, starting: bool = False) -> float:
        """How long `key` must wait for its use to fall back to its fair share (0: none):
        once more than `over` times past it, until it is back to it. A call `starting`
        counts what the client's running calls are expected to cost too (running.py)."""
        now = self._clock()
        if now - self._refreshed >= self.settings.refresh_s:
            self._refresh(now)  # not judged against a split from before the loop caught up
        if self._fair == math.inf:
            return 0.0
        rate = self.use(key)
        if starting:
            window = self.settings.window_s
            rate += self._running.expected_s(key, rate, now, window) / window
        split = self._fair * self._weight(key)
        if rate <= split * self.settings.over:
            return 0.0
        return self.settings.window_s * math.log(rate / split)

    def _weight(self, key: str) -> float:
        """A client's split in credentialed clients' splits: less for calls with no valid
        credential."""
        return self.settings.anonymous if key.startswith(ANONYMOUS) else 1.0

    async def turn(self, key: str | None, starting: bool = False) -> None:
        """Return once `key` may go on: at once unless the loop is busy and `key` is over
        its fair share or has calls waiting already. A call `starting` is judged with what
        the client's running calls are expected to cost (`running`). A client's waiting
        calls and writes go one at a time, in the order they came (those of its calls
        already running first, as a request started is never queued behind new ones), each
        once the client is back to its share (the one let go before has taken its first
        step by then, and counts), or once it has waited `max_wait_s` (a client whose
        streams work for others may stay over its share; its own calls, a Dispose among
        them, still go on). A call's deadline still ends a wait; None, a client not told
        apart, never waits."""
        if key is None:
            return
        line = self._lines.get(key)
        if line is None:
            if not self.wait_s(key, starting):
                return
            line = self._lines[key] = _Line()
        self._waited[key] = self._waited.get(key, 0) + 1
        self.on_wait()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (line.new if starting else line.going).append((self._clock(), waiter))
        if line.handle is None or not self.wait_s(key, starting):  # within its share: go now
            self._look_again(key, line, 0.0)
        await waiter  # one cancelled after it was let go costs the next one a moment only

    @contextlib.contextmanager
    def running_call(self, key: str) -> Generator[None]:
        """Count a call of `key` as running while inside: its next calls starting are judged
        with what it is expected to cost (`turn`)."""
        self._running.begin(key)
        try:
            yield
        finally:
            self._running.end(key, self._clock(), self.settings.window_s)

    def running_calls(self, key: str) -> int:
        """How many unary calls of `key` run now (`running_call`)."""
        return self._running.calls(key)

    def waiting(self, key: str) -> int:
        """How many calls and writes of `key` wait for their turn now."""
        line = self._lines.get(key)
        return 0 if line is None else sum(not waiter.done() for waiter in line.all())

    def _let_go(self, key: str) -> None:
        """Let `key`'s first waiting call go if it may, and look again when it may."""
        line = self._lines[key]
        line.handle = None
        first = line.first()
        if first is None:
            del self._lines[key]
            return
        waiters, starting = first
        if line.new and line.new[0][0] + self.settings.max_wait_s <= self._clock():
            waiters, starting = line.new, True  # overdue: it goes, running calls waiting or not
        since, waiter = waiters[0]
        wait = self.wait_s(key, starting)
        overdue_in = since + self.settings.max_wait_s - self._clock()
        if wait and overdue_in > 0:
            # looked at again at least every refresh_s: the split may have changed, and
            # a running call may have ended
            self._look_again(key, line, min(wait, overdue_in, self.settings.refresh_s))
            return
        waiters.popleft()
        waiter.set_result(None)
        # after the call let go has taken its first step: its cost counts for the next
        self._look_again(key, line, 0.0)

    def _look_again(self, key: str, line: _Line, delay: float) -> None:
        if line.handle is not None:
            line.handle.cancel()
        loop = asyncio.get_running_loop()
        line.handle = (
            loop.call_soon(self._let_go, key)
            if delay <= 0
            else loop.call_later(delay, self._let_go, key)
        )

    async def metered(self, key: str, work: Coroutine[Any, Any, T]) -> T:
        """`work` run to its end, the time of each of its steps counted against `key`."""
        return await _stepped(work, lambda seconds: self.charge(key, seconds))

    def lag_s(self) -> float:
        """How late the loop ran lately: a timer's lateness, averaged."""
        return self._lag

    def start(self) -> None:
        """Measure the loop's lateness from now on, until `stop()`, while calls are in
        flight: the heartbeat starts with the first call or message charged and stops at a
        beat that finds none charged since the one before and no call waiting, so an idle
        sidecar wakes for nothing. With `lag_s` and `busy` 0 nothing is measured."""
        self.running = True
        self._quiet_at = asyncio.get_running_loop().time()

    def _beat_again(self) -> None:
        """Start the heartbeat, with load."""
        if not (self.settings.lag_s or self.settings.busy):
            return
        self._caught_up()
        self._cpu_at = self._cpu()
        loop = asyncio.get_running_loop()
        beat = self.settings.beat_s
        self._beat = loop.call_later(beat, self._beaten, loop.time() + beat)

    def _caught_up(self) -> None:
        """While the heartbeat is stopped, the time since it stopped counts as beats on time
        with the thread idle, as it measured them when it ticked through idle times."""
        if self._beat is None and self.running:
            now = asyncio.get_running_loop().time()
            self.late(0.0, max(0.0, now - self._quiet_at))
            self._quiet_at = now

    def reconfigure(self, settings: ShareSettings) -> None:
        """Take reloaded `settings`: when serving, the loop's lateness is measured again
        as they say (not at all with `lag_s` and `busy` 0); waiting calls wait on."""
        self.settings = settings
        if self.running:
            self._stop_beat()
            self.start()

    def stop(self) -> None:
        """Stop measuring the loop's lateness, and let every waiting call go (the sidecar
        drains: what is in flight is to finish within the grace, not wait its turn)."""
        self.running = False
        self._stop_beat()
        self._lag, self._busy, self._busy_at, self._fair = 0.0, 0.0, -math.inf, math.inf
        for line in self._lines.values():
            if line.handle is not None:
                line.handle.cancel()
            for waiter in line.all():
                if not waiter.done():
                    waiter.set_result(None)
        self._lines.clear()

    def _stop_beat(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

    def late(self, lag: float, elapsed: float, busy: float = 0.0) -> None:
        """Count a timer `lag` seconds late, `elapsed` after the one before, the loop's
        thread busy `busy` of that time."""
        kept = math.exp(-elapsed / self.settings.window_s)
        self._lag = self._lag * kept + lag * (1 - kept)
        self._busy = self._busy * kept + busy * (1 - kept)

    def busy(self) -> float:
        """How much of the time the loop's thread was busy lately (its CPU time), averaged."""
        return self._busy

    def _beaten(self, due: float) -> None:
        loop = asyncio.get_running_loop()
        now, beat = loop.time(), self.settings.beat_s
        self.beats += 1
        elapsed, cpu = beat + max(0.0, now - due), self._cpu()
        self.late(max(0.0, now - due), elapsed, min(1.0, (cpu - self._cpu_at) / elapsed))
        self._cpu_at = cpu
        if not self._charged and not self._lines:  # nothing in flight: stop until there is
            self._beat, self._quiet_at = None, now
            return
        self._charged = False
        self._beat = loop.call_later(beat, self._beaten, now + beat)

    def _refresh(self, now: float) -> None:
        """Forget idle clients; then, when the loop runs late or is busy, split the time
        the clients' calls take equally among them."""
        self._refreshed = now
        self._caught_up()
        window, idle = self.settings.window_s, self.settings.idle
        for key, use in list(self._uses.items()):
            if use.now(now, window) < idle:
                del self._uses[key]
                self._waited.pop(key, None)
                self._running.forget(key)
        lag_s, busy = self.settings.lag_s, self.settings.busy
        if (lag_s and self._lag >= lag_s) or (busy and self._busy >= busy):
            self._busy_at = now
        # Shares hold for a window after the loop last ran late or busy: held back, the heaviest
        # client lets the loop catch up at once, and would otherwise be let go at once.
        # Split among the clients charged within the window: a client gone (a closed
        # connection is one) still decays for seconds, and counted, would shrink everyone's
        # split (the soak's reconnecting clients, held in a calm run).
        sharing = [key for key, use in self._uses.items() if now - use.at <= window]
        if now - self._busy_at > window or len(sharing) < 2:
            self._fair = math.inf
        else:
            # at least `floor` of a whole loop split equally: held to the quiet clients' use
            # alone, a busy client would leave the loop idle while the host is short of CPU
            total = self._total.now(now, window)
            self._fair = max(total, self.settings.floor) / sum(map(self._weight, sharing))


def share_key(client: Client | None, anonymous: bool = False) -> str | None:
    """The key `client`'s use is counted against. With `anonymous` (credentials are
    configured), a call that presented no valid credential is counted against `ANONYMOUS`
    followed by its address's key over TCP (a kubelet's probes are not held behind a flood
    from elsewhere), by itself over loopback or a unix socket, whose split is the smaller
    (`ShareSettings.anonymous`). Else a client told apart by its credential or its
    address; else None, over loopback or a unix socket without credentials, where nobody
    is held (a connection is no client there: an agent reconnecting is a new one each
    time, and splitting the loop among connections held calm agents back; and an idle
    sidecar's probes wake nothing)."""
    key = client.key if client is not None and client.key.startswith(IDENTIFIED) else None
    if anonymous and not (key or "").startswith(CREDENTIALED):
        return ANONYMOUS + (key or "")
    return key


# By hand: only its driver sees each step, and the time a call awaits is no one's use of the loop
@types.coroutine
def _stepped(
    work: Coroutine[Any, Any, T], charge: Callable[[float], None]
) -> Generator[Any, Any, T]:
    """Drive `work` as its task would, timing each step (from one await to the next): the
    time a step holds the loop is what a call costs everyone else."""
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        started = time.perf_counter()
        try:
            awaited = work.send(sent) if thrown is None else work.throw(thrown)
        except StopIteration as done:
            value: T = done.value
            return value
        finally:
            charge(time.perf_counter() - started)
            # a cancellation thrown in holds this frame in its traceback: not the other way too
            thrown = None
        try:
            sent, thrown = (yield awaited), None
        except BaseException as error:  # a cancellation thrown into the task: work's to handle
            sent, thrown = None, error
