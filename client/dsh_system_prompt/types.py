"""The client's value types: compared by value, so whole assemblies compare."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

TOOL_ORDER_REST = "<unlisted-tools>"
PERSONA_SECTION = "deployment:persona"
PERSONA_ORDER = 0

ChangeKind = Literal["section", "context", "tools", "variable", "suppressor", "listener", "scope"]
ChangeAction = Literal["registered", "unregistered"]


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


@dataclass
class ToolSchema:
    """A tool as the model sees it; `parameters` is a JSON Schema object."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolProviderResult:
    """A tool provider's answer: visible schemas, and the pre-restriction names."""

    schemas: list[ToolSchema] = field(default_factory=list)
    known_names: list[str] | None = None


@dataclass
class PromptAssembly:
    """What the model is told: sections, contexts, tools and resolved variables."""

    sections: list[AssembledSection] = field(default_factory=list)
    contexts: list[AssembledContext] = field(default_factory=list)
    tools: list[ToolSchema] = field(default_factory=list)
    variables: dict[str, str | None] = field(default_factory=dict)


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


@dataclass(frozen=True)
class ChangeEvent:
    """One registration or disposal seen on the change stream."""

    revision: int
    kind: ChangeKind
    action: ChangeAction
    name: str
    scope: str | None


@dataclass(frozen=True)
class ChangesMissed:
    """The watcher fell behind: `count` events from `first_revision` were dropped.

    Re-read whatever state you track as of `resync_revision`; events after it follow.
    """

    first_revision: int
    count: int
    resync_revision: int
