"""Who may do what: each credential's role and grants, decided per request, no transport.

Modelled on Kubernetes RBAC's default roles: `admin` is cluster-admin (everything),
`agent` is edit limited to named resources (the scope keys its credential lists,
as patterns) with the pod-wide writes (the global layer, complete sections, global
listeners, the built-in sections) each granted by name, and `reader` is view
(watches and listings; values, like Secrets for view, only when granted). A
request is described by what it reads or writes (`Request`); `decide` says
whether the credential may, or what it lacks (`Denial`).
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass

from ..registry import BUILTIN_SECTIONS, Reach


class Role(enum.StrEnum):
    """What a credential is for."""

    ADMIN = "admin"
    AGENT = "agent"
    READER = "reader"


@dataclass(frozen=True)
class Grants:
    """What a role needs granted by name; an admin has it all."""

    scopes: tuple[str, ...] = ()  # key patterns (`*`, `?`, `[ab]`) it may read, and write
    global_layer: bool = False  # agent: register in the global layer
    complete: bool = False  # agent: register complete sections
    global_listeners: bool = False  # agent: listeners that see every assembly
    builtins: bool = False  # agent: sections named like the built-ins, in its layers
    values: bool = False  # reader: listings with values, prompts and assemblies


@dataclass(frozen=True)
class Credential:
    """One identity the sidecar knows: a bearer token's or a client certificate's."""

    name: str
    role: Role
    grants: Grants = Grants()
    token_file: str | None = None
    client_certificate: str | None = None  # under mTLS: the certificate's CN or a SAN

    def describe(self) -> str:
        return f'credential "{self.name}" ({self.role.value})'


ADMIN = Credential(name="admin", role=Role.ADMIN)
"""The one credential of a sidecar without auth, or of `auth_token_file` alone."""


class Verb(enum.StrEnum):
    """What a request does, as the policy tells requests apart."""

    OPEN_SESSION = "open a session"
    REGISTER = "register"
    OPEN_SCOPE = "open a scope handle"
    CHANGE_OWN = "dispose or update its registrations"
    ASSEMBLE = "assemble"
    REPORT = "write the cache history"
    READ_HISTORY = "read the cache history"
    WATCH_CHANGES = "watch changes"
    LIST = "list registrations"
    WATCH_PROMPT = "watch a prompt"
    LISTEN = "install a listener"
    RULE = "register a rule"


WRITES = frozenset(
    {Verb.REGISTER, Verb.OPEN_SCOPE, Verb.CHANGE_OWN, Verb.REPORT, Verb.LISTEN, Verb.RULE}
)


@dataclass(frozen=True)
class Request:
    """What one call reads or writes; `scope` None is the global layer."""

    verb: Verb
    scope: str | None = None
    every_scope: bool = False  # a watch or listing of every layer
    kind: str = ""  # what is registered: section, context, tools, variable, suppressor
    name: str = ""
    complete: bool = False
    everywhere: bool = False  # a listener or rule that sees every assembly
    parent: str | None = None  # a scope handle's parent key
    values: bool = False  # the answer carries registered values
    report_key: str = ""  # a caller-named cache history key


@dataclass(frozen=True)
class Denial:
    """Why a credential may not: the message of its PERMISSION_DENIED."""

    message: str


def decide(credential: Credential, request: Request) -> Denial | None:
    """None when `credential` may make `request`, else what it lacks."""
    if credential.role is Role.ADMIN:
        return None
    if credential.role is Role.READER:
        lack = _reader_lacks(credential.grants, request)
    else:
        lack = _agent_lacks(credential.grants, request)
    if lack is None:
        return None
    return Denial(f"{credential.describe()} may not {request.verb.value}: {lack}")


def _reader_lacks(grants: Grants, request: Request) -> str | None:
    if request.verb in WRITES:
        return "a reader never writes"
    if request.verb is Verb.OPEN_SESSION:
        return None  # a client opens one to connect; registering through it is a write
    shows_values = request.verb in (Verb.ASSEMBLE, Verb.WATCH_PROMPT) or request.values
    if shows_values and not grants.values:
        return "it is not granted values ('values = true')"
    return _reads_lack(grants, request)


def _agent_lacks(grants: Grants, request: Request) -> str | None:
    verb = request.verb
    if verb in (Verb.OPEN_SESSION, Verb.CHANGE_OWN):
        return None  # its own session, its own registrations (checked when made)
    if verb is Verb.OPEN_SCOPE:
        return _scope_lacks(grants, request.scope) or _scope_lacks(grants, request.parent)
    if verb is Verb.REGISTER:
        return _register_lacks(grants, request)
    if verb in (Verb.LISTEN, Verb.RULE):  # a rule reshapes assemblies as a listener does
        noun = "a listener" if verb is Verb.LISTEN else "a rule"
        if request.everywhere and not grants.global_listeners:
            return f"{noun} on every assembly needs 'global_listeners = true'"
        return None if request.everywhere else _scope_lacks(grants, request.scope)
    return _reads_lack(grants, request)


def _register_lacks(grants: Grants, request: Request) -> str | None:
    if request.scope is None and not grants.global_layer:
        return "the global layer needs 'global = true'"
    if request.complete and not grants.complete:
        return "a complete section needs 'complete = true'"
    if request.kind == "section" and request.name in BUILTIN_SECTIONS and not grants.builtins:
        return f"a section named \"{request.name}\" needs 'builtins = true'"
    return _scope_lacks(grants, request.scope)


def _reads_lack(grants: Grants, request: Request) -> str | None:
    """A read of one scope (with what it is made of: its ancestors, the global layer),
    or of every layer; a caller-named history key is read like a scope key."""
    if request.every_scope and not may_see_every_scope(grants):
        return "every scope needs the scope pattern '*': name a scope it lists"
    if request.report_key and (lack := _key_lacks(grants, request.report_key, "report key")):
        return lack
    return _scope_lacks(grants, request.scope)


def _scope_lacks(grants: Grants, scope: str | None) -> str | None:
    return None if scope is None else _key_lacks(grants, scope, "scope")


def _key_lacks(grants: Grants, key: str, what: str) -> str | None:
    if may_read_scope(grants, key):
        return None
    listed = ", ".join(grants.scopes) or "none"
    return f'{what} "{key}" is not in its scopes ({listed})'


def may_see_values(credential: Credential) -> bool:
    """Whether `credential` is ever shown registered values: all but a reader not granted
    them (`values`)."""
    return credential.role is not Role.READER or credential.grants.values


def may_read_scope(grants: Grants, key: str) -> bool:
    """Whether `key` matches one of the credential's scope patterns."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in grants.scopes)


def may_see_every_scope(grants: Grants) -> bool:
    return "*" in grants.scopes


def step_names(credential: Credential) -> Callable[[str | None], bool] | None:
    """Which layers' waterfall steps `credential` is shown by name (None: every layer's, for
    an admin or a credential with the pattern '*'): the scopes it lists, never the global
    layer. A watch shows what a listing shows the same credential (Kubernetes RBAC), and a
    listing of a scope's chain shows every step that runs there, wherever it is held."""
    grants = credential.grants
    if credential.role is Role.ADMIN or may_see_every_scope(grants):
        return None
    return lambda scope: scope is not None and may_read_scope(grants, scope)


def reach_of(credential: Credential) -> Reach | None:
    """How far the steps and dynamic providers of `credential`'s sessions reach: the scopes it
    may read (registry/reach.py); None, every scope, for an admin or `global_listeners`."""
    if credential.role is Role.ADMIN or credential.grants.global_listeners:
        return None
    return Reach(owner=f'credential "{credential.name}"', scopes=credential.grants.scopes)
