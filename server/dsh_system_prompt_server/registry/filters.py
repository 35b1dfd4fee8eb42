"""Filters of watches and listings, and what the registry shows of each registration."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace

from dsh_system_prompt_core import Reason

from .model import AnyRegistration, ChangeEvent, Kind, Skipped, ToolSet, runs_everywhere
from .rules import Rule

# Kinds whose value a listing can show (the others hold no value of their own).
VALUED = frozenset({Kind.SECTION, Kind.CONTEXT, Kind.VARIABLE, Kind.TOOLS, Kind.RULE})
STEPS = frozenset({Kind.LISTENER, Kind.RULE})  # the waterfall's steps


def everywhere_step(entry: AnyRegistration) -> bool:
    """Whether `entry` is a waterfall step that runs for every assembly: registered with
    `global`, or held in the global layer."""
    return entry.kind in STEPS and (entry.scope is None or runs_everywhere(entry))


def listed(keeps: Callable[[Kind, str | None], bool], entry: AnyRegistration) -> bool:
    """Whether a listing keeps `entry`: one of a layer the filter keeps, or a step that runs
    everywhere wherever it keeps the global layer, as a watch keeps its events."""
    return keeps(entry.kind, entry.scope) or (everywhere_step(entry) and keeps(entry.kind, None))


def anonymous(event: ChangeEvent) -> ChangeEvent:
    """A step's `event` as a caller not shown its name sees it: no name, ref, fingerprint or
    reason, and, when it runs everywhere, the global layer's rather than its own layer's."""
    everywhere = event.everywhere or event.scope is None
    scope = None if everywhere else event.scope
    return replace(
        event, name="", ref="", fingerprint="", reason="", scope=scope, everywhere=everywhere
    )


def shown_skipped(
    steps: tuple[Skipped, ...], shows: Callable[[str | None], bool] | None
) -> tuple[Skipped, ...]:
    """An assembly's skipped `steps` as a caller shown only the steps of the layers `shows`
    names (None: every layer's) sees them: the others without name, ref or message naming
    them, as its watches and listings show them (docs/operations.md, "Trust model")."""
    if shows is None or not any(s.kind in STEPS and not shows(s.scope) for s in steps):
        return steps
    return tuple(s if s.kind not in STEPS or shows(s.scope) else _anonymous_skip(s) for s in steps)


def shown_failure(step: Skipped, shows: Callable[[str | None], bool] | None) -> str | None:
    """The message of an assembly that `step` failed, for a caller shown only the steps of
    the layers `shows` names: None when it may be told the step's own words."""
    if shows is None or step.kind not in STEPS or shows(step.scope):
        return None
    return f"{_unnamed(step)[1]} held outside this credential's scopes failed ({step.reason})"


def _unnamed(step: Skipped) -> tuple[str | None, str]:
    """The layer a step not shown by name is shown in, and the words that describe it."""
    origin = step.origin()
    assert origin is not None  # a listener or rule (STEPS)
    shown = origin.unnamed()
    return shown.held, shown.describe()


def _anonymous_skip(step: Skipped) -> Skipped:
    scope, described = _unnamed(step)
    if step.reason == Reason.OUT_OF_REACH:
        why = "its owner may not read this assembly's scope"
    else:
        why = f"{step.reason} under failure_policy IGNORE"
    message = f"{described} held outside this credential's scopes was skipped: {why}"
    return Skipped(step.kind, "", scope, "", step.reason, message, scope is None)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which registrations a watch or listing keeps: by layer and by kind.

    `scope` None keeps every layer; a scope keeps its own layer, and with
    `ancestors` also its ancestors' layers and the global one. Empty `kinds`
    keeps every kind.
    """

    scope: str | None = None
    ancestors: bool = False
    kinds: frozenset[Kind] = frozenset()

    def matcher(self, chain: Callable[[str], list[str]]) -> Callable[[Kind, str | None], bool]:
        """A test of (kind, layer) against this filter; `chain` gives a scope's ancestry
        now (parents may be bound later, so it is asked at each test)."""
        kinds, scope, ancestors = self.kinds, self.scope, self.ancestors

        def keeps(kind: Kind, layer: str | None) -> bool:
            if kinds and kind not in kinds:
                return False
            if scope is None or layer == scope:
                return True
            return ancestors and (layer is None or layer in chain(scope))

        return keeps


def public_ref(registration_id: str) -> str:
    """A registration's name in events and listings: derived from its id, never the id,
    which with the session id is what disposes it; "" for none (a step shown unnamed)."""
    return _digest(b"ref:" + registration_id.encode()) if registration_id else ""


def owner_label(owner: str) -> str:
    """A short label telling apart sessions of one client name, derived from the session."""
    return _digest(b"owner:" + owner.encode())[:8]


class Fingerprints:
    """Static values' fingerprints, keyed for this incarnation of the sidecar: 16 hex digits
    of HMAC-SHA256 under a random key made when it starts and never shown. Within the
    incarnation equal values have equal fingerprints, so a watcher or a listing tells
    "changed or not"; but a reader not granted values cannot test guesses against one (an
    unkeyed SHA-256 gave a 4-digit PIN away among 10,080 candidates in 7 ms, issue 34), and
    another sidecar, or this one restarted, prints the same value differently."""

    def __init__(self) -> None:
        self._keyed = hmac.new(secrets.token_bytes(32), digestmod=hashlib.sha256)

    def of(self, kind: Kind, value: object) -> str:
        """The fingerprint of a static value; "" for a dynamic one or none at all."""
        encoded = _encoded(value) if kind in VALUED else None
        if encoded is None:
            return ""
        keyed = self._keyed.copy()  # the key's inner and outer states, hashed once
        keyed.update(encoded)
        return keyed.hexdigest()[:16]


def _encoded(value: object) -> bytes | None:
    # A tag byte keeps a text, "no value" and tools apart; \0 separates fields.
    if isinstance(value, str):
        return b"t" + value.encode()
    if isinstance(value, ToolSet):
        fields = [b"j"]
        for tool in value.schemas:
            fields += [tool.name.encode(), tool.description.encode(), tool.parameters_json.encode()]
        if value.known_names is not None:
            fields += [b"k", *(name.encode() for name in value.known_names)]
        return b"\0".join(fields)
    if value is None:
        return b"n"
    if isinstance(value, Rule):  # its definition, as the wire carries it
        return b"r" + value.spec.SerializeToString(deterministic=True)
    return None  # a Dynamic: its value is the provider's, at each assembly


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
