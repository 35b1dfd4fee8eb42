"""Layers (global and per scope) and the scope tree that chains them.

An entry is taken out of its layer by what it is (its kind, its name or id, its scope),
so a layer keeps no remover per entry: a closure for each cost more than the entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsh_system_prompt_core import Reason

from .errors import RegistryError, Status
from .model import (
    ContextRegistration,
    SectionRegistration,
    SuppressorRegistration,
    ToolsRegistration,
    VariableRegistration,
)

# What lives in a layer (listeners and scope handles live elsewhere).
LayerEntry = (
    SectionRegistration
    | ContextRegistration
    | VariableRegistration
    | ToolsRegistration
    | SuppressorRegistration
)


@dataclass(eq=False, slots=True)
class Layer:
    """The registrations of one layer, each map in registration order.

    Sections, contexts and variables are keyed by name (a nearer layer's
    shadows a farther one's); tool providers and suppressors by id.
    """

    sections: dict[str, SectionRegistration] = field(default_factory=dict)
    contexts: dict[str, ContextRegistration] = field(default_factory=dict)
    variables: dict[str, VariableRegistration] = field(default_factory=dict)
    tools: dict[str, ToolsRegistration] = field(default_factory=dict)
    suppressors: dict[str, SuppressorRegistration] = field(default_factory=dict)

    def add_section(self, entry: SectionRegistration) -> None:
        self.sections[entry.name] = entry

    def add_context(self, entry: ContextRegistration) -> None:
        self.contexts[entry.name] = entry

    def add_variable(self, entry: VariableRegistration) -> None:
        self.variables[entry.name] = entry

    def add_tools(self, entry: ToolsRegistration) -> None:
        self.tools[entry.id] = entry

    def add_suppressor(self, entry: SuppressorRegistration) -> None:
        self.suppressors[entry.id] = entry

    def remove(self, entry: LayerEntry) -> None:
        """Take out `entry`, found where its `add_...` put it."""
        if isinstance(entry, SectionRegistration):
            del self.sections[entry.name]
        elif isinstance(entry, ContextRegistration):
            del self.contexts[entry.name]
        elif isinstance(entry, VariableRegistration):
            del self.variables[entry.name]
        elif isinstance(entry, ToolsRegistration):
            del self.tools[entry.id]
        else:
            del self.suppressors[entry.id]

    def is_empty(self) -> bool:
        return not (
            self.sections or self.contexts or self.variables or self.tools or self.suppressors
        )


class Layers:
    """The global layer and one per scope that holds something, made on first use."""

    def __init__(self) -> None:
        self.global_ = Layer()
        self._scoped: dict[str, Layer] = {}

    def of(self, scope: str | None) -> Layer:
        """The layer of `scope` (None: the global one), made if it has none yet."""
        if scope is None:
            return self.global_
        layer = self._scoped.get(scope)
        if layer is None:
            layer = self._scoped[scope] = Layer()
        return layer

    def along(self, chain: list[str]) -> list[Layer]:
        """The global layer, then the layers of the chain's scopes, farthest first."""
        return [self.global_, *(self._scoped[k] for k in reversed(chain) if k in self._scoped)]

    def remove(self, entry: LayerEntry) -> None:
        """Take `entry` out of its layer, and forget a scope's layer once it holds nothing."""
        if entry.scope is None:
            self.global_.remove(entry)
            return
        layer = self._scoped[entry.scope]
        layer.remove(entry)
        if layer.is_empty():
            del self._scoped[entry.scope]


class ScopeTree:
    """Scope keys, their parent bindings and open handles.

    A key's parent is bound once. A key is forgotten when it has no open
    handle and no bound child, so closed agents leave nothing behind. The keys
    whose binding was made or undone since last asked (`rebound`) are what the
    next change event names: their chains, and their descendants', changed.
    """

    def __init__(self) -> None:
        self._parent: dict[str, str | None] = {}
        self._handles: dict[str, int] = {}
        self._children: dict[str, int] = {}
        self._rebound: list[str] = []

    def check_open(self, key: str, parent: str | None) -> None:
        """Raise unless a handle on `key` with `parent` may be opened."""
        if not key:
            raise RegistryError(
                Status.INVALID_ARGUMENT, Reason.INVALID_SCOPE, "scope keys must be non-empty"
            )
        if parent is None:
            return
        bound = self._parent.get(key)
        if bound is not None and bound != parent:
            raise RegistryError(
                Status.ALREADY_EXISTS,
                Reason.SCOPE_PARENT_CONFLICT,
                f'scope "{key}" already has parent "{bound}"; it cannot be bound to "{parent}"',
            )
        ancestors = self.chain(parent)
        if bound is None and key in ancestors:
            cycle = " -> ".join([key, *ancestors[: ancestors.index(key) + 1]])
            raise RegistryError(
                Status.INVALID_ARGUMENT,
                Reason.SCOPE_CYCLE,
                f'binding scope "{key}" to parent "{parent}" would close a cycle: {cycle}',
            )

    def open(self, key: str, parent: str | None) -> None:
        """Record a handle on `key` (after `check_open`), binding its parent if given."""
        self._handles[key] = self._handles.get(key, 0) + 1
        if parent is not None and self._parent.get(key) is None:
            self._parent[key] = parent
            self._children[parent] = self._children.get(parent, 0) + 1
            self._rebound.append(key)
        else:
            self._parent.setdefault(key, None)

    def close(self, key: str) -> None:
        """Drop one handle on `key`, forgetting keys that nothing holds any more."""
        self._handles[key] -= 1
        self._forget_if_unused(key)

    def chain(self, scope: str | None) -> list[str]:
        """The scope, its parent, ... farthest ancestor last; empty for no scope."""
        chain: list[str] = []
        key = scope
        while key is not None:
            chain.append(key)
            key = self._parent.get(key)
        return chain

    def keys(self) -> list[str]:
        return list(self._parent)

    def rebound(self) -> tuple[str, ...]:
        """The keys whose parent binding was made or undone since the last call."""
        keys, self._rebound = tuple(self._rebound), []
        return keys

    def knows(self, key: str) -> bool:
        """Whether `key` is held by an open handle or is the parent of one."""
        return key in self._parent

    def _forget_if_unused(self, key: str) -> None:
        while key in self._parent and not self._handles.get(key) and not self._children.get(key):
            parent = self._parent.pop(key)
            self._handles.pop(key, None)
            self._children.pop(key, None)
            if parent is None:
                return
            self._rebound.append(key)  # its chain loses the parent: no event of its own says so
            self._children[parent] -= 1
            key = parent
