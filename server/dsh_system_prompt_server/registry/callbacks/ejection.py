"""Callbacks that do not answer are dead peers: after `eject_after_timeouts` consecutive
timeouts a provider or listener is ejected (docs/protocol.md, "Ejected callbacks").

An assembly whose callback does not answer in time still fails, naming it (the
spec's "fail loud"); what ejection changes is how long a silent callback stays in
everyone's assemblies: the ones in flight during its timeout fail, none after.
Only a timeout of the callback's whole time counts: one cut short by the caller's
own deadline says nothing about the callback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from dsh_system_prompt_core import Reason

from ..errors import Failure
from ..model import AnyRegistration, Dynamic, ListenerRegistration
from .failure_policy import Skips

TIMEOUTS = frozenset({Reason.PROVIDER_TIMEOUT, Reason.LISTENER_TIMEOUT})

Remove = Callable[[AnyRegistration, str], None]
# What makes a trace span named for one step (`rule "name"`): the server's, when it traces.
StepSpans = Callable[[str], AbstractContextManager[Any]]
"""Dispose a registration, with the reason its change event gives."""


class Ejector:
    """Counts each callback's consecutive timeouts; the `after()`-th ejects it (0: never)."""

    def __init__(self, remove: Remove, after: Callable[[], int] = lambda: 1) -> None:
        self._remove = remove
        self._after = after  # the live eject_after_timeouts
        self._timeouts: dict[str, int] = {}  # registration id -> consecutive timeouts
        # The service's: log and count an ejection (the registry knows no telemetry).
        self.on_eject: Callable[[AnyRegistration, Failure], None] = lambda *_: None
        # what makes a span for each rule an assembly runs: the server's, when it traces
        self.step_spans: StepSpans | None = None
        # The service's: count one rule's run by its outcome ("ok", "skipped", "failed"),
        # and forget a disposed one's counts.
        self.on_rule: Callable[[AnyRegistration, str], None] = lambda *_: None
        self.on_gone: Callable[[AnyRegistration], None] = lambda _: None

    def answered(self, entry: AnyRegistration) -> None:
        """`entry` answered (or failed loudly): its count starts again."""
        if self._timeouts:
            self._timeouts.pop(entry.id, None)

    def failed(self, entry: AnyRegistration, error: Failure, whole: bool) -> None:
        """`entry` failed with `error`; `whole` when it had its whole time to answer."""
        if error.reason not in TIMEOUTS or not whole:
            self.answered(entry)  # a loud failure is its owner's bug, not a dead peer
            return
        after = self._after()
        if not after or entry.disposed:
            return
        count = self._timeouts.get(entry.id, 0) + 1
        if count < after:
            self._timeouts[entry.id] = count
            return
        self._timeouts.pop(entry.id, None)
        self._eject(entry, error)

    def _eject(self, entry: AnyRegistration, why: Failure) -> None:
        """A dead peer: its owner is told on its stream, and it is disposed with an event
        that says why."""
        if isinstance(entry, ListenerRegistration):
            entry.value.ejected(why)
        elif isinstance(entry.value, Dynamic):
            entry.value.host.ejected(entry.id, why)
        self._remove(entry, f"ejected: {why.message}")
        self.on_eject(entry, why)

    def forget(self, entry: AnyRegistration) -> None:
        """The registration is gone: nothing more to count for it."""
        self._timeouts.pop(entry.id, None)
        self.on_gone(entry)


class Budget:
    """The time one assembly gives each of its callbacks, and what their failures mean.

    A callback waits its own `timeout_s` (declared at registration) or the sidecar's
    `provider_timeout_s`, cut to leave the caller's deadline time to hear the error. A
    failure counts toward ejection whatever the callback's failure policy; `skips` holds
    the steps the assembly went on without.
    """

    def __init__(
        self, limit: float, deadline: float | None, ejector: Ejector | None = None
    ) -> None:
        self.limit = limit
        self._deadline = deadline
        self._ejector = ejector
        self.skips = Skips()
        # a span for each step the sidecar runs itself, when it traces
        self.spans = None if ejector is None else ejector.step_spans
        self.ran: Callable[[AnyRegistration, str], None] = (
            (lambda *_: None) if ejector is None else ejector.on_rule
        )

    def __call__(self, own: float | None = None) -> float:
        """How long a callback with its own timeout `own` (None: the default) may take now."""
        limit = own or self.limit
        if self._deadline is None:
            return limit
        left = self._deadline - asyncio.get_running_loop().time()
        # Leave the caller time to receive an error that names the culprit.
        return max(0.0, min(limit, left - min(0.1, left * 0.1)))

    def answered(self, entry: AnyRegistration) -> None:
        if self._ejector is not None:
            self._ejector.answered(entry)

    def failed(
        self, entry: AnyRegistration, error: Failure, given: float, own: float | None = None
    ) -> None:
        """`entry` failed with `error` after it was given `given` seconds."""
        if self._ejector is not None:
            self._ejector.failed(entry, error, whole=given >= (own or self.limit))
