"""The client's value types: compared by value, so whole assemblies compare."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from dsh_system_prompt_core import Reason

# "unknown": a value this client does not know, sent by a newer sidecar.
ChangeKind = Literal[
    "section",
    "context",
    "tools",
    "variable",
    "suppressor",
    "listener",
    "scope",
    "config",
    "rule",
    "unknown",
]
ChangeAction = Literal["registered", "unregistered", "updated", "unknown"]
SourceKind = Literal["builtin", "global", "scope", "listener", "rule", "unknown"]
PartKind = Literal["tool", "section", "context", "unknown"]
# The order a model server caches tools and the system prompt in (see docs/prompt-cache.md).
PrefixLayout = Literal["tools-first", "system-first"]
# What a reported assembly does to its report key's tool freeze (docs/prompt-cache.md).
ToolFreeze = Literal["hold", "release"]


class FailurePolicy(enum.StrEnum):
    """What an assembly does when a provider or listener fails or does not answer in time
    (docs/protocol.md, "Failure policy"), as a Kubernetes admission webhook's
    `failurePolicy`."""

    FAIL = "fail"
    """The assembly fails, naming the callback: the spec's behaviour and the default."""
    IGNORE = "ignore"
    """The assembly goes on without the callback's step, and says so (`assembly.skipped`).
    Only for a callback that decorates the prompt, never for one that filters it."""


@dataclass(frozen=True)
class SkippedStep:
    """A step an assembly went on without: a callback under `FailurePolicy.IGNORE` that
    failed, did not answer in time, or was gone."""

    kind: ChangeKind  # a provider's kind ("section", "context", "tools", "variable") or "listener"
    name: str  # its name, or the label of a tool provider or listener
    scope: str | None  # the scope whose layer holds it; None for the global layer
    ref: str  # its public reference, as in change events and listings
    reason: Reason | str  # PROVIDER_FAILED, PROVIDER_TIMEOUT, LISTENER_FAILED, ...
    message: str  # what the assembly would have failed with under FailurePolicy.FAIL


@dataclass(frozen=True)
class SkippedCount:
    """How many steps of one kind a reported assembly went on without for one reason (a
    cache history's entry counts them; the steps themselves are in its report)."""

    kind: ChangeKind  # as SkippedStep.kind
    reason: Reason | str  # as SkippedStep.reason
    count: int  # at least 1


@dataclass
class AssembledSection:
    """A prompt section as assembled: text resolved, not yet interpolated."""

    name: str
    text: str


@dataclass
class AssembledContext:
    """A runtime context as assembled: text resolved, not yet interpolated."""

    name: str
    text: str


class ToolSchema:
    """A tool as the model sees it; `parameters` is a JSON Schema object.

    Received schemas keep their JSON text and parse it only when `parameters`
    is first read, so passing tools along (listeners, adapters that send the
    JSON on) costs no parsing and stays byte-identical.
    """

    __slots__ = ("_json", "_parameters", "description", "name")

    def __init__(
        self, name: str, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        self.name = name
        self.description = description
        self._parameters: dict[str, Any] | None = {} if parameters is None else parameters
        self._json: str | None = None

    @classmethod
    def from_json(cls, name: str, description: str, parameters_json: str) -> ToolSchema:
        """A schema whose parameters are JSON text, parsed when first read."""
        tool = cls(name, description)
        tool._parameters, tool._json = None, parameters_json
        return tool

    @property
    def parameters(self) -> dict[str, Any]:
        if self._parameters is None:
            assert self._json is not None
            self._parameters = json.loads(self._json)
            self._json = None  # the dict may now change: it is the truth from here on
        return self._parameters

    @parameters.setter
    def parameters(self, value: dict[str, Any]) -> None:
        self._parameters, self._json = value, None

    def parameters_json(self) -> str | None:
        """The JSON text as received, while `parameters` has not been read; else None."""
        return self._json

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolSchema):
            return NotImplemented
        return (self.name, self.description, self.parameters) == (
            other.name,
            other.description,
            other.parameters,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclasses beside it

    def __repr__(self) -> str:
        return (
            f"ToolSchema(name={self.name!r}, description={self.description!r},"
            f" parameters={self.parameters!r})"
        )


@dataclass
class ToolProviderResult:
    """A tool provider's answer: visible schemas, and the pre-restriction names."""

    schemas: list[ToolSchema] = field(default_factory=list)
    known_names: list[str] | None = None


@dataclass(frozen=True)
class Source:
    """Where an assembled part came from: "builtin", "global", "scope", "listener" or "rule"."""

    kind: SourceKind
    scope: str | None = None  # for "scope": the layer's scope key
    ancestor_depth: int = 0  # for "scope": 0 is the assembly's own scope, 1 its parent, ...
    listener: str = ""  # for "listener": the listener that added or last changed it
    rule: str = ""  # for "rule": the rule that added or last changed it
    description: str = ""  # the same in words


@dataclass(frozen=True)
class Size:
    """A size in UTF-8 bytes and, where the sidecar has a tokenizer, in tokens."""

    bytes: int
    tokens: int | None = None


@dataclass(frozen=True)
class PartReport:
    """One rendered part, in model order: its origin, size, fingerprint and stability."""

    kind: PartKind
    name: str
    source: Source
    bytes: int
    tokens: int | None
    fingerprint: str
    stable: bool


@dataclass(frozen=True)
class PrefixStability:
    """How much of the prefix (in the report's layout) is unchanged since last time.

    `stable_bytes`/`stable_tokens` are the true common prefix with the previous
    report of the history key; `recomputed` is what the break costs the model
    server, and when `messages_recomputed` every message after it is recomputed too.
    """

    has_previous: bool
    stable_bytes: int
    stable_tokens: int | None
    prefix: Size
    first_changed: str  # e.g. 'section "cwd"'; "" when nothing changed
    reason: str  # e.g. 'section "cwd" text changed (variable {{cwd}} changed)'
    recomputed: Size = Size(0)
    messages_recomputed: bool = False
    diff: str = ""  # a short -/+ diff of the first changed part
    previous_evicted: bool = False  # an earlier report existed but was evicted


@dataclass(frozen=True)
class ToolOrderReport:
    """A stably ordered assembly's tools (config `tool_order_mode = "stable"`) against the
    order sorting gave: `kept` when they differ, then the first `position` where they do,
    the tool sorting would have put there and the one kept there."""

    kept: bool
    position: int = 0
    sorted_tool: str = ""
    kept_tool: str = ""


@dataclass(frozen=True)
class AssemblyReport:
    """Provenance, sizes and prefix stability of one assembly (`assemble(report=True)`)."""

    tokenizer: str  # "" when sizes are bytes only
    parts: list[PartReport]
    tools: Size
    prompt: Size
    context_snapshot: Size
    stability: PrefixStability
    variables: dict[str, Source]
    render_error: str = ""  # why the assembly does not render, naming the part; "" if it does
    prefix_layout: PrefixLayout = "system-first"
    history_key: str = ""  # e.g. 'scope "agent-1"' or 'key "conv-7"'
    skipped: tuple[SkippedStep, ...] = ()  # the steps the assembly went on without
    tool_order: ToolOrderReport | None = None  # set only when the sidecar keeps a stable order


@dataclass
class PromptAssembly:
    """What the model is told: sections, contexts, tools and resolved variables.

    `report` is set when the assembly was asked for with `report=True`, and
    `skipped` lists the steps the sidecar's assembly went on without (callbacks
    under `FailurePolicy.IGNORE` that failed; empty when it is complete); neither is
    part of the assembly's value (equality ignores them). One received from the
    sidecar converts each part from the message when that part is first read.
    """

    sections: list[AssembledSection] = field(default_factory=list)
    contexts: list[AssembledContext] = field(default_factory=list)
    tools: list[ToolSchema] = field(default_factory=list)
    variables: dict[str, str | None] = field(default_factory=dict)
    report: AssemblyReport | None = field(default=None, compare=False, repr=False)
    skipped: tuple[SkippedStep, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def _received(cls, parts: ReceivedParts) -> PromptAssembly:
        """An assembly whose parts are converted from `parts` as each is first read.

        Reading, assigning, comparing or rendering it behaves exactly like a
        built one: a field read for the first time is converted and kept as an
        ordinary attribute, so later reads cost nothing.
        """
        assembly = cls.__new__(cls)
        assembly.__dict__[_RECEIVED] = parts
        return assembly

    if not TYPE_CHECKING:  # mypy keeps checking attribute names as declared above

        def __getattr__(self, name: str) -> Any:
            # Reached only for a part not converted yet (a received assembly's).
            parts = self.__dict__.get(_RECEIVED)
            if parts is None or name not in _PARTS:
                raise AttributeError(f"'PromptAssembly' object has no attribute {name!r}")
            value = parts.convert(name)
            self.__dict__[name] = value
            if all(part in self.__dict__ for part in _PARTS):
                del self.__dict__[_RECEIVED]  # all converted: the message is not needed
            return value


class ReceivedParts(Protocol):
    """An assembly's parts as received, converted one field at a time."""

    def convert(self, name: str) -> Any:
        """The value of field `name` ("sections", "contexts", "tools" or "variables")."""


_PARTS = ("sections", "contexts", "tools", "variables")
_RECEIVED = "_received_parts"


def unconverted(assembly: PromptAssembly, name: str) -> ReceivedParts | None:
    """What a received `assembly` converts field `name` from, while it has not been read
    (nor assigned); None once it has, or for a built assembly."""
    parts: ReceivedParts | None = assembly.__dict__.get(_RECEIVED)
    return None if parts is None or name in assembly.__dict__ else parts


@dataclass(frozen=True)
class AssembleContext:
    """What one assembly is for: the scope and the caller's free-form fields."""

    scope: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        """A field's value, or `default` when the caller did not set it."""
        return self.fields.get(key, default)


@dataclass(frozen=True)
class RenderedPrompt:
    """An assembly rendered by the sidecar."""

    prompt: str
    context_snapshot: str
    assembly: PromptAssembly

    @property
    def skipped(self) -> tuple[SkippedStep, ...]:
        """The steps the assembly went on without (`assembly.skipped`)."""
        return self.assembly.skipped


@dataclass(frozen=True)
class ChangeEvent:
    """One registration, update or disposal seen on the change stream."""

    revision: int
    kind: ChangeKind
    action: ChangeAction
    name: str
    scope: str | None
    ref: str = ""  # the registration's public reference, as in RegistrationInfo.ref
    fingerprint: str = ""  # its value's after the change; "" when gone or not static
    reason: str = ""  # why the sidecar disposed it on its own (an ejected callback), or ""
    rebound_scopes: tuple[str, ...] = ()  # scope keys whose parent binding it made or undid
    # It concerns every scope's assemblies (the global layer's, or a step that runs
    # everywhere); None: not said, by a sidecar before ChangeEvent.global.
    global_: bool | None = None


@dataclass(frozen=True)
class ChangesMissed:
    """The watcher fell behind: `count` events from `first_revision` were dropped.

    Re-read whatever state you track as of `resync_revision`; events after it follow.
    """

    first_revision: int
    count: int
    resync_revision: int


@dataclass(frozen=True)
class RegistrationInfo:
    """One registration as a listing shows it (`client.snapshot()`).

    `fingerprint` is equal for equal static values within the sidecar's incarnation
    (keyed: it changes when the sidecar restarts; "" for a dynamic one);
    `value` is the static value when the listing asked for values
    (`has_value`): a text, None (a variable's "no value"), a ToolProviderResult or a
    rule's `dsp.Rule`.
    """

    ref: str  # the same as ChangeEvent.ref of its events
    kind: ChangeKind
    name: str
    scope: str | None
    order: float | None
    complete: bool
    dynamic: bool
    owner: str  # the owning session's client name
    owner_label: str  # tells sessions of one client name apart
    size_bytes: int
    fingerprint: str
    has_value: bool = False
    value: object = None  # a str, a ToolProviderResult, a dsp.Rule or None (see above)
    global_: bool = False  # a listener or rule that runs for every scope's assemblies


@dataclass(frozen=True)
class Snapshot:
    """The registrations at `revision` of the sidecar incarnation `incarnation`."""

    revision: int
    incarnation: str
    registrations: list[RegistrationInfo] = field(default_factory=list)


@dataclass(frozen=True)
class ChangesResynced:
    """The change stream could not be resumed event by event: rebuild from `snapshot`.

    `reason` is "restarted" (the sidecar is a new incarnation: revisions began
    again) or "behind" (the changes since the last one delivered are no longer
    in the sidecar's history). The events after `snapshot.revision` follow.
    """

    reason: Literal["restarted", "behind"]
    snapshot: Snapshot


@dataclass(frozen=True)
class PromptChange:
    """One message of `client.watch_prompt()`: the scope's prompt from its static parts.

    Dynamic parts hold placeholders (`<dynamic section "cwd">`); listeners are
    not run. `report.stability` is the prompt-cache verdict against the
    previous message (none on the first); `changes` are what led here.
    """

    revision: int
    incarnation: str
    assembly: PromptAssembly | None  # None when the static parts do not assemble
    prompt: str | None  # the rendered prompt, when asked for and it renders
    context_snapshot: str | None
    report: AssemblyReport | None
    changes: list[ChangeEvent]
    changes_omitted: int = 0
    error: str = ""  # why the static parts do not assemble
