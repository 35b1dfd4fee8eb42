"""Values the registry stores and assembles, and the interfaces of the parties it calls.

Assembly values are immutable where they can be (parts and tools), so that an
assembly can share them with the registry and with other assemblies without
copying; the lists and the variable map of an `Assembly` are fresh per assembly.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypedDict, TypeVar

from .provenance import Origin, OriginKind, Origins, Trace

if TYPE_CHECKING:
    from .errors import Failure

# No session id is empty, so no session can dispose the sidecar's built-ins.
SIDECAR_OWNER = ""


@dataclass(frozen=True, slots=True)
class Part:
    """A section or runtime context of an assembly: resolved, not yet interpolated."""

    name: str
    text: str


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool schema; `parameters_json` is kept byte-for-byte as registered."""

    name: str
    description: str
    parameters_json: str


@dataclass(frozen=True, slots=True)
class ToolSet:
    """A tool provider's answer: visible schemas and the pre-restriction universe."""

    schemas: tuple[Tool, ...]
    known_names: tuple[str, ...] | None = None

    def known(self) -> tuple[str, ...]:
        """The names toolOrder is checked against (the schemas' names by default)."""
        if self.known_names is not None:
            return self.known_names
        return tuple(tool.name for tool in self.schemas)


@dataclass(slots=True)
class Assembly:
    """The assembled prompt handed to listeners and returned to callers.

    `origins` is filled only when the caller asked to track provenance: it maps
    (`PartKind`, name) to an `Origin`, and
    `trace` holds the scope chain and what each listener step changed.
    """

    sections: list[Part]
    contexts: list[Part]
    tools: list[Tool]
    variables: dict[str, str | None]
    origins: Origins | None = None
    trace: Trace | None = None
    # The steps this assembly went on without (callbacks under IGNORE that failed).
    skipped: tuple[Skipped, ...] = ()

    def copy(self) -> Assembly:
        """A new assembly sharing the immutable parts and tools (not the provenance)."""
        return Assembly(
            sections=list(self.sections),
            contexts=list(self.contexts),
            tools=list(self.tools),
            variables=dict(self.variables),
        )


@dataclass(frozen=True, slots=True)
class AssembleContext:
    """What one assembly is for; `fields_json` is passed through unread, but by the rules,
    which read `fields`: the text parsed when the request was (None: parsed when read)."""

    scope: str | None = None
    fields_json: str = ""
    fields: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)


class Kind(enum.Enum):
    """What a registration is; the values are the change events' `kind` words."""

    SECTION = "section"
    CONTEXT = "context"
    TOOLS = "tools"
    VARIABLE = "variable"
    SUPPRESSOR = "suppressor"
    LISTENER = "listener"
    SCOPE = "scope"
    CONFIG = "config"  # a sidecar setting reloaded live; never a registration
    RULE = "rule"  # a waterfall step the sidecar runs itself (registry/rules/)


class FailurePolicy(enum.Enum):
    """What an assembly does when a callback fails or does not answer in time
    (docs/protocol.md, "Failure policy")."""

    FAIL = "fail"  # the assembly fails, naming it: the spec's behaviour
    IGNORE = "ignore"  # the assembly goes on without its step, and says so


@dataclass(frozen=True, slots=True)
class Skipped:
    """A step an assembly went on without: a callback under IGNORE that failed."""

    kind: Kind  # a provider's kind, or LISTENER
    name: str
    scope: str | None
    registration_id: str
    reason: str  # the failure's stable reason (PROVIDER_TIMEOUT, LISTENER_FAILED, ...)
    message: str
    everywhere: bool = False  # a step registered with `global`, wherever it is held

    def origin(self) -> Origin | None:
        """The listener or rule skipped, as a report names a step (with its layer); None for
        a dynamic provider, which is no step of the waterfall."""
        kind = _STEP_ORIGINS.get(self.kind)
        if kind is None:
            return None
        return Origin(kind, listener=self.name, held=self.scope, everywhere=self.everywhere)


_STEP_ORIGINS = {Kind.LISTENER: OriginKind.LISTENER, Kind.RULE: OriginKind.RULE}


class Action(enum.Enum):
    """What happened to a registration; the values are the change events' `action` words."""

    REGISTERED = "registered"
    UNREGISTERED = "unregistered"
    UPDATED = "updated"


@dataclass(frozen=True, slots=True)
class ProviderCall:
    """One dynamic provider that an assembly needs the value of."""

    key: str
    kind: Kind
    name: str
    scope: str | None

    def describe(self) -> str:
        """How errors name the provider: `section provider "cwd" in scope "a"`."""
        where = f' in scope "{self.scope}"' if self.scope is not None else " (global)"
        label = f' "{self.name}"' if self.name else ""
        return f"{self.kind.value} provider{label}{where}"


ProvidedValue = str | None | ToolSet


@dataclass(frozen=True, slots=True)
class Exchange:
    """What one message asks a provider host: the calls to evaluate, for which assembly, in
    what time (the whole exchange's `timeout`, and each call's own in `times`, by call key,
    for a host whose providers answer one by one)."""

    calls: Sequence[ProviderCall]
    context: AssembleContext
    timeout: float
    times: Mapping[str, float]


class ProviderHost(Protocol):
    """Whoever evaluates dynamic providers (a client session)."""

    async def provide(self, exchange: Exchange) -> Mapping[str, ProvidedValue | Failure]:
        """Evaluate every call of `exchange`; return each value by call key, or the
        Failure of a provider that alone failed (PROVIDER_FAILED, naming it). A host
        whose providers answer one by one gives each call its own time (`times`): one
        that did not answer within it alone fails, PROVIDER_TIMEOUT.

        Raises a Failure when the whole exchange fails (PROVIDER_TIMEOUT, a broken
        answer, or UNAVAILABLE when the host is gone).
        """
        ...

    def ejected(self, registration_id: str, why: Failure) -> None:
        """One of its providers did not answer in time and was disposed: tell its owner,
        who may register it again."""
        ...


NextFn = Callable[[Assembly], Awaitable[Assembly]]


class ListenerHost(Protocol):
    """Whoever runs a waterfall listener (a client's listener stream)."""

    async def invoke(
        self, assembly: Assembly, context: AssembleContext, next_: NextFn, timeout: float | None
    ) -> Assembly:
        """Run the listener once; it may call `next_` at most once.

        The host must not mutate `assembly`. Raises a Failure naming the
        listener (LISTENER_FAILED, LISTENER_TIMEOUT, UNAVAILABLE).
        """
        ...

    def disposed(self) -> None:
        """The listener's registration is gone; it will not be invoked again."""
        ...

    def ejected(self, why: Failure) -> None:
        """The listener did not answer in time and is ejected (`disposed` follows): tell
        its owner, who may install it again."""
        ...


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """What a callback's answer depends on besides the revision: the assemble context
    too (`by_context`), and for how long it may be reused (`ttl_s`, None: no limit)."""

    by_context: bool = False
    ttl_s: float | None = None


@dataclass(frozen=True, slots=True)
class Dynamic:
    """A value that the owning host provides at each assembly (or, with `cache`, at
    the first that needs it and again only once the answer may have changed)."""

    host: ProviderHost
    key: str
    cache: CachePolicy | None = None
    timeout_s: float | None = None  # its own answer time; None: provider_timeout_s
    failure_policy: FailurePolicy = FailurePolicy.FAIL


V = TypeVar("V")


@dataclass(eq=False, kw_only=True, slots=True)
class Registration(Generic[V]):
    """One registration: owned by a session, living in one layer, holding one value.

    The value by kind: a section's or context's text, a variable's value (None
    for no value), a tool set (each of these, or the `Dynamic` that provides
    it), a listener's host; None for suppressors and scope handles.
    """

    id: str
    owner: str
    kind: Kind
    scope: str | None
    handle: str | None
    value: V
    name: str = ""
    disposed: bool = False
    fingerprint: str = ""  # of the static value (filters.Fingerprints, keyed); "" if none

    def provider_call(self, key: str) -> ProviderCall:
        return ProviderCall(key=key, kind=self.kind, name=self.name, scope=self.scope)


@dataclass(eq=False, kw_only=True, slots=True)
class SectionRegistration(Registration[str | Dynamic]):
    order: float
    complete: bool = False


@dataclass(eq=False, kw_only=True, slots=True)
class ContextRegistration(Registration[str | Dynamic]):
    order: float


@dataclass(eq=False, kw_only=True, slots=True)
class VariableRegistration(Registration[str | Dynamic | None]):
    """A variable: its value, no value (None), or the provider of either."""


@dataclass(eq=False, kw_only=True, slots=True)
class ToolsRegistration(Registration[ToolSet | Dynamic]):
    """A tool provider: a static tool set or the provider of one."""


@dataclass(eq=False, kw_only=True, slots=True)
class SuppressorRegistration(Registration[None]):
    """Runtime context suppressed in its layer while it lives."""


@dataclass(eq=False, kw_only=True, slots=True)
class ListenerRegistration(Registration[ListenerHost]):
    global_: bool
    position: int
    cache: CachePolicy | None = None  # None: invoked at every assembly
    timeout_s: float | None = None  # its own answer time; None: provider_timeout_s
    failure_policy: FailurePolicy = FailurePolicy.FAIL


# A rule reads only the assembly, the fields and the scope: its result may be reused as a
# callback's that declared it depends on the context (and nothing expires it).
RULE_CACHE = CachePolicy(by_context=True)


class RuleValue(Protocol):
    """A rule as its registration holds it: compiled by registry/rules/ (a `Rule`), named
    here by what the registry reads of it, so that this module needs none of that one."""

    @property
    def failure_policy(self) -> FailurePolicy: ...

    @property
    def spec(self) -> object: ...  # its definition as given (the proto's RuleSpec)


@dataclass(eq=False, kw_only=True, slots=True)
class RuleRegistration(Registration[RuleValue]):
    """A rule: a waterfall step the sidecar runs itself, placed as a listener is. An
    operator's rule (the config's) may hold a scope `pattern` instead of a layer."""

    global_: bool
    position: int
    pattern: str | None = None  # fnmatch-style, against each key of the assembly's chain
    cache: CachePolicy | None = RULE_CACHE

    @property
    def failure_policy(self) -> FailurePolicy:
        return self.value.failure_policy


# A step of the waterfall: a client's listener, or a rule the sidecar runs.
StepRegistration = ListenerRegistration | RuleRegistration


@dataclass(eq=False, kw_only=True, slots=True)
class ScopeHandle(Registration[None]):
    """A session's handle on a scope key; registrations made through it die with it."""

    children: dict[str, AnyRegistration] = field(default_factory=dict)
    # the parent key its OpenScope named (None: none), decided with it again at a reload
    parent: str | None = None

    @classmethod
    def opened(cls, id: str, owner: str, key: str, parent: str | None) -> ScopeHandle:
        """A new handle `id` of `owner` on scope `key`, opened naming `parent`."""
        return cls(
            id=id,
            owner=owner,
            kind=Kind.SCOPE,
            scope=key,
            handle=None,
            name=key,
            value=None,
            parent=parent,
        )


# A registration whose value is static or given by a dynamic provider.
ValueRegistration = (
    SectionRegistration | ContextRegistration | VariableRegistration | ToolsRegistration
)
# One registration of any kind, each kind its own class.
AnyRegistration = (
    ValueRegistration
    | ListenerRegistration
    | RuleRegistration
    | ScopeHandle
    | SuppressorRegistration
)


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One registration, update or disposal, numbered by a revision that only grows."""

    revision: int
    kind: Kind
    action: Action
    name: str
    scope: str | None
    ref: str = ""  # the registration's public reference (filters.public_ref)
    fingerprint: str = ""  # its value's after the change; "" when gone or not static
    reason: str = ""  # why the sidecar disposed it (an ejected callback); "" otherwise
    everywhere: bool = False  # a step registered with `global` (runs_everywhere)
    rebound: tuple[str, ...] = ()  # scope keys whose parent binding it made or undid


def runs_everywhere(entry: object) -> bool:
    """Whether `entry` is a waterfall step registered with `global`: it runs for every
    scope's assemblies, whichever layer holds it, so its change is every chain's."""
    return isinstance(entry, ListenerRegistration | RuleRegistration) and entry.global_


class RegistrationFields(TypedDict):
    """What every registration records (`registration_fields`)."""

    id: str
    owner: str
    kind: Kind
    scope: str | None
    handle: str | None
    name: str


def registration_fields(
    owner: str, kind: Kind, handle: ScopeHandle | None, name: str = ""
) -> RegistrationFields:
    """A new registration's: a new id, its owner, kind, layer (its handle's key) and handle."""
    return {
        "id": new_id(),
        "owner": owner,
        "kind": kind,
        "scope": None if handle is None else handle.name,
        "handle": None if handle is None else handle.id,
        "name": name,
    }


def new_id() -> str:
    """An unguessable identifier for registrations and sessions."""
    return secrets.token_urlsafe(18)
