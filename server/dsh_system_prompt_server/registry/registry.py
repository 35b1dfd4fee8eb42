"""The registry: layered registrations owned by sessions, and assembly over them.

Registrations are kept by owner, updated in place and disposed with their owner; each
assembly works on its scope's plan (`plan_cache`), made by `assembly/`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Literal, TypeVar

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import (
    HARNESS_IDENTITY_ORDER,
    HARNESS_IDENTITY_SECTION,
    HARNESS_IDENTITY_TEXT,
    PERSONA_ORDER,
    PERSONA_SECTION,
    is_variable_name,
)

from ..config import flat
from . import errors
from .admission import Admission, StaticValue
from .assembly import Plan, assemble_plan
from .callbacks import Budget, CallbackCache, Ejector, ListenerIndex
from .changes import ChangeFeed
from .filters import Fingerprints
from .inspection import Inspection, Invalidation, Reaching
from .layers import Layer, Layers, ScopeTree
from .limits import Limits
from .model import (
    SIDECAR_OWNER,
    Action,
    AnyRegistration,
    AssembleContext,
    Assembly,
    CachePolicy,
    ContextRegistration,
    Dynamic,
    FailurePolicy,
    Kind,
    ListenerHost,
    ListenerRegistration,
    RuleRegistration,
    ScopeHandle,
    SectionRegistration,
    SuppressorRegistration,
    ToolSet,
    ToolsRegistration,
    VariableRegistration,
    new_id,
    registration_fields,
)
from .plan_cache import PlanCache
from .revisions import LayerRevisions
from .rule_book import RuleBook
from .rules import OperatorRule, Rule, compile_rule
from .settings import RegistrySettings

_UPDATABLE = frozenset({Kind.SECTION, Kind.CONTEXT, Kind.VARIABLE, Kind.TOOLS})

E = TypeVar("E", bound=AnyRegistration)


class Registry(Inspection, Invalidation, Reaching):
    """Every registration of the sidecar, by layer and by owner."""

    def __init__(self, settings: RegistrySettings | None = None) -> None:
        self.settings = settings or RegistrySettings()
        self.changes = ChangeFeed(self.settings.change_history)
        self._fingerprints = Fingerprints()  # keyed for this incarnation (built-ins first)
        self._layers, self._scopes = Layers(), ScopeTree()
        self._entries: dict[str, AnyRegistration] = {}
        self._by_owner: dict[str, dict[str, AnyRegistration]] = {}
        self._admission = Admission(lambda: self.settings)
        self.clients = self._admission.clients  # the layer above binds each owner to a client
        self._listeners = ListenerIndex()
        self.layer_revisions = LayerRevisions()
        self._plans = PlanCache(self._layers, self._scopes, self._listeners, self.layer_revisions)
        self.callbacks = CallbackCache(max_bytes=self.settings.limits.max_callback_cache_bytes)
        self.ejector = Ejector(self._remove, lambda: self.settings.eject_after_timeouts)
        self._builtins: dict[str, SectionRegistration] = {}
        if self.settings.include_harness_identity:
            self._add_builtin(
                HARNESS_IDENTITY_SECTION, HARNESS_IDENTITY_ORDER, HARNESS_IDENTITY_TEXT
            )
        self._add_builtin(PERSONA_SECTION, PERSONA_ORDER, self.settings.persona)
        self._rules = RuleBook(self._listeners, self._admission)
        self._set_operator_rules(self.settings.rules)

    def reconfigure(self, settings: RegistrySettings) -> list[str]:
        """Apply reloaded settings; returns the config keys that changed.

        The built-in sections come, go or are updated like registrations (their
        change events); every other changed setting is a `config` event named for its
        key. Either moves the revision, so no plan or cached response outlives it.
        """
        old, self.settings = self.settings, settings
        self.callbacks.max_bytes = settings.limits.max_callback_cache_bytes
        self.changes.history = settings.change_history
        before = flat(old)
        changed = [key for key, value in flat(settings).items() if before[key] != value]
        if settings.include_harness_identity != old.include_harness_identity:
            if settings.include_harness_identity:
                self._add_builtin(
                    HARNESS_IDENTITY_SECTION, HARNESS_IDENTITY_ORDER, HARNESS_IDENTITY_TEXT
                )
            else:
                self._remove(self._builtins.pop(HARNESS_IDENTITY_SECTION))
        if settings.persona != old.persona:  # in place, as update() does: no gap for assemblies
            self._replace_value(self._builtins[PERSONA_SECTION], settings.persona)
        self._set_operator_rules(settings.rules)
        # the built-ins' keys changed as their sections and rules did; the rest are `config` events
        others = replace(
            settings,
            persona=old.persona,
            include_harness_identity=old.include_harness_identity,
            rules=old.rules,
        )
        for key, value in flat(others).items():
            if before[key] != value:
                event = self.changes.publish(Kind.CONFIG, Action.REGISTERED, key, None)
                self.layer_revisions.changed(None, event.revision)
        return changed

    @property
    def revision(self) -> int:
        return self.changes.revision

    def chain_revision(self, keys: Iterable[str]) -> int:
        """The revision of the last change to what an assembly on the scope keys `keys`
        (a scope and its ancestors) is made of, the global layer included."""
        return self.layer_revisions.of(keys)

    @property
    def limits(self) -> Limits:
        """The limits in force (reloaded with the settings)."""
        return self._admission.limits

    # -- registration -----------------------------------------------------------------

    def register_section(
        self,
        owner: str,
        handle: str | None,
        name: str,
        order: float,
        text: str | Dynamic,
        complete: bool = False,
    ) -> SectionRegistration:
        """Add a section to the global layer or the layer of scope handle `handle`."""
        scope_handle, layer = self._admitted_text(owner, handle, "section", name, order, text)
        entry = SectionRegistration(
            **registration_fields(owner, Kind.SECTION, scope_handle, name),
            value=text,
            order=order,
            complete=complete,
        )
        layer.add_section(entry)
        return self._added(entry, scope_handle)

    def register_context(
        self, owner: str, handle: str | None, name: str, order: float, text: str | Dynamic
    ) -> ContextRegistration:
        """Add a runtime context to the global layer or a scope's layer."""
        scope_handle, layer = self._admitted_text(owner, handle, "context", name, order, text)
        entry = ContextRegistration(
            **registration_fields(owner, Kind.CONTEXT, scope_handle, name), value=text, order=order
        )
        layer.add_context(entry)
        return self._added(entry, scope_handle)

    def register_variable(
        self, owner: str, handle: str | None, name: str, value: str | Dynamic | None
    ) -> VariableRegistration:
        """Add a variable, referenced from text as {{name}}."""
        scope_handle = self._handle(owner, handle)
        layer = self._layers.of(_key(scope_handle))
        self.limits.check_name("prompt variable", name)
        if not is_variable_name(name):
            raise errors.invalid_variable_name(name)
        if name in layer.variables:
            raise errors.duplicate_entry("prompt variable", name, _key(scope_handle))
        self._admission.check_value(
            owner, self._owned(owner), f'prompt variable "{name}" value', value
        )
        entry = VariableRegistration(
            **registration_fields(owner, Kind.VARIABLE, scope_handle, name),
            value=value,
        )
        layer.add_variable(entry)
        return self._added(entry, scope_handle)

    def register_tools(
        self, owner: str, handle: str | None, source: ToolSet | Dynamic, name: str = ""
    ) -> ToolsRegistration:
        """Add a tool provider (any number per layer)."""
        scope_handle = self._handle(owner, handle)
        self.limits.check_name("tool provider", name)
        self._admission.check_tools(owner, self._owned(owner), source)
        entry = ToolsRegistration(
            **registration_fields(owner, Kind.TOOLS, scope_handle, name),
            value=source,
        )
        layer = self._layers.of(_key(scope_handle))
        layer.add_tools(entry)
        return self._added(entry, scope_handle)

    def suppress_runtime_context(self, owner: str, handle: str | None) -> SuppressorRegistration:
        """Suppress runtime context for a scope (or everywhere) until disposed."""
        scope_handle = self._handle(owner, handle)
        self._admission.check_quota(self._owned(owner))
        entry = SuppressorRegistration(
            **registration_fields(owner, Kind.SUPPRESSOR, scope_handle), value=None
        )
        layer = self._layers.of(_key(scope_handle))
        layer.add_suppressor(entry)
        return self._added(entry, scope_handle)

    def add_listener(
        self,
        owner: str,
        handle: str | None,
        host: ListenerHost,
        *,
        prepend: bool = False,
        global_: bool = False,
        name: str = "",
        cache: CachePolicy | None = None,
        timeout_s: float | None = None,
        failure_policy: FailurePolicy = FailurePolicy.FAIL,
    ) -> ListenerRegistration:
        """Install a waterfall listener; `prepend` runs it before earlier ones; with `cache`,
        its result is reused while the policy allows; under IGNORE, a failure is skipped."""
        scope_handle = self._handle(owner, handle)
        self.limits.check_name("listener", name)
        self._admission.check_quota(self._owned(owner))
        self._admission.check_listeners(owner, len(self._listeners), timeout_s)
        entry = ListenerRegistration(
            **registration_fields(owner, Kind.LISTENER, scope_handle, name),
            value=host,
            global_=global_,
            position=self._listeners.next_position(prepend),
            cache=cache,
            timeout_s=timeout_s,
            failure_policy=failure_policy,
        )
        self._listeners.add(entry)
        return self._added(entry, scope_handle)

    def add_rule(
        self,
        owner: str,
        handle: str | None,
        name: str,
        spec: pb.RuleSpec,
        *,
        prepend: bool = False,
        global_: bool = False,
    ) -> RuleRegistration:
        """Install a rule (docs/protocol.md, "Rules"): compiled and checked now (RULE_INVALID),
        run as a step of the waterfall, placed among the listeners as one is."""
        scope_handle = self._handle(owner, handle)
        owned = self._by_owner.get(owner, {})
        rule = self._rules.admitted(name, spec, _key(scope_handle), owned.values())
        self._admission.check_quota(len(owned))
        return self._install_rule(owner, scope_handle, rule, prepend, global_)

    def _install_rule(
        self,
        owner: str,
        handle: ScopeHandle | None,
        rule: Rule,
        prepend: bool,
        global_: bool,
        pattern: str | None = None,
    ) -> RuleRegistration:
        entry = RuleRegistration(
            **registration_fields(owner, Kind.RULE, handle, rule.name),
            value=rule,
            global_=global_,
            position=self._listeners.next_position(prepend),
            pattern=pattern,
        )
        self._listeners.add(entry)
        return self._added(entry, handle)

    def open_scope(self, owner: str, key: str, parent: str | None = None) -> ScopeHandle:
        """Open a handle on scope `key`, binding its parent the first time one is given."""
        self.limits.check_name("scope", key)
        if parent is not None:
            self.limits.check_name("scope", parent)
        self._admission.check_quota(self._owned(owner))
        self._scopes.check_open(key, parent)
        self._scopes.open(key, parent)
        return self._added(ScopeHandle.opened(new_id(), owner, key, parent), None)

    # -- disposal ---------------------------------------------------------------------

    def dispose(self, owner: str, registration_id: str) -> None:
        """Dispose one of `owner`'s registrations; anyone else's is NOT_FOUND."""
        entry = self._by_owner.get(owner, {}).get(registration_id)
        if entry is None:
            raise errors.not_found()
        self._remove(entry)

    def dispose_owner(self, owner: str) -> int:
        """Dispose everything `owner` registered, newest first; returns how many."""
        owned = self._by_owner.get(owner, {})
        count = 0
        while owned:
            self._remove(next(reversed(owned.values())))
            count += 1
        self._by_owner.pop(owner, None)
        self.clients.unbind(owner)
        self._plans.reaches.unbind(owner)
        return count

    # -- updates ----------------------------------------------------------------------

    def update(
        self, owner: str, registration_id: str, value: StaticValue | pb.RuleSpec
    ) -> AnyRegistration:
        """Replace the static value of one of `owner`'s registrations, in place.

        Only the value changes (name, order, layer, owner and id stay), so the
        entry keeps its place everywhere and an assembly sees the old value or
        the new one. The new value is checked as at registration. An equal value
        changes nothing: no new revision, no event.
        """
        entry = self._by_owner.get(owner, {}).get(registration_id)
        if entry is None:
            raise errors.not_found()
        if isinstance(entry, RuleRegistration):
            if not isinstance(value, pb.RuleSpec):
                raise errors.wrong_value_kind(f'rule "{entry.name}"', "a rule")
            if entry.value.spec != value:  # a rule's place stays; what it does is compiled anew
                self._replace_value(entry, compile_rule(entry.name, value, self.limits))
            return entry
        if entry.kind not in _UPDATABLE or isinstance(entry.value, Dynamic):
            raise errors.not_updatable(entry.kind.value, entry.name)
        if isinstance(value, pb.RuleSpec):
            raise errors.wrong_value_kind(f'{entry.kind.value} "{entry.name}"', "its own value")
        self._admission.check_update(entry, value)
        if entry.value == value:
            return entry
        self._admission.grow(entry, value)
        self._replace_value(entry, value)
        return entry

    def _replace_value(self, entry: AnyRegistration, value: StaticValue | Rule) -> None:
        """Put `value` in the entry's place (its fingerprint with it) and say so."""
        entry.value = value
        entry.fingerprint = self._fingerprints.of(entry.kind, value)
        self._publish(entry, Action.UPDATED)

    def _remove(self, entry: AnyRegistration, reason: str = "") -> None:
        if isinstance(entry, ScopeHandle):
            for child in reversed(list(entry.children.values())):
                self._remove(child)
        entry.disposed = True
        del self._entries[entry.id]
        del self._by_owner[entry.owner][entry.id]
        if entry.handle is not None:
            parent = self._entries.get(entry.handle)
            if isinstance(parent, ScopeHandle):
                parent.children.pop(entry.id, None)
        self._unlink(entry)
        self._admission.released(entry)
        self.ejector.forget(entry)
        self._plans.drop(self._publish(entry, Action.UNREGISTERED, reason))  # what they held

    # -- assembly ---------------------------------------------------------------------

    async def assemble(
        self, context: AssembleContext | None = None, deadline: float | None = None
    ) -> Assembly:
        """Assemble for `context` on the registrations present now.

        `deadline` is an event-loop time after which no provider or listener
        is waited for; each waits at most `provider_timeout_s` anyway.
        """
        context = context or AssembleContext()
        return await self.run(self.plan(context.scope), context, deadline)

    async def run(
        self,
        plan: Plan,
        context: AssembleContext,
        deadline: float | None = None,
        track: bool = False,
    ) -> Assembly:
        """Assemble from `plan` (taken by `plan()`) for `context`.

        With `track`, the result's `origins` say where each part came from.
        """
        timeout = Budget(self.settings.provider_timeout_s, deadline, self.ejector)
        return await assemble_plan(
            plan, context, self.settings.tool_order, self.limits, timeout, track, self.callbacks
        )

    def plan(self, scope: str | None) -> Plan:
        """The registrations an assembly for `scope` works on now (reused until a change).

        A key no handle opened has no layer of its own: its plan is the global one,
        and the key is not kept (callers choose keys freely; memory is not theirs).
        """
        if scope is not None:
            self.limits.check_name("scope", scope)
        known = scope if scope is None or self._scopes.knows(scope) else None
        return self._plans.plan(known, self.settings.include_runtime_context, scope)

    # -- helpers ----------------------------------------------------------------------

    def _handle(self, owner: str, handle: str | None) -> ScopeHandle | None:
        if handle is None:
            return None
        entry = self._by_owner.get(owner, {}).get(handle)
        if not isinstance(entry, ScopeHandle):
            raise errors.scope_not_found()
        return entry

    def _add_builtin(self, name: str, order: float, text: str) -> None:
        # The sidecar's own sections come from its config, not from a session: no limits.
        fields = registration_fields(SIDECAR_OWNER, Kind.SECTION, None, name)
        entry = SectionRegistration(**fields, value=text, order=order)
        self._layers.global_.add_section(entry)
        self._builtins[name] = self._added(entry, None)

    def _set_operator_rules(self, rules: tuple[OperatorRule, ...]) -> None:
        """The config's rules in force: those gone removed, new ones added (in the config's
        order), a changed definition updated in place, a changed place removed and added."""
        changes = self._rules.operator_changes(rules)
        for entry in changes.gone:
            self._remove(entry)
        for entry, rule in changes.changed:
            self._replace_value(entry, rule)
        for given in changes.new:
            installed = self._install_rule(
                SIDECAR_OWNER, None, given.compiled, given.prepend, True, given.pattern
            )
            self._rules.operator[given.name] = installed

    def _admitted_text(
        self,
        owner: str,
        handle: str | None,
        noun: Literal["section", "context"],
        name: str,
        order: float,
        text: str | Dynamic,
    ) -> tuple[ScopeHandle | None, Layer]:
        """The scope handle (`handle`, an id of `owner`'s) and the layer a new section or
        context (`noun`) goes into, once admitted there."""
        scope_handle = self._handle(owner, handle)
        key = _key(scope_handle)
        layer = self._layers.of(key)
        self._admission.check_text(owner, self._owned(owner), noun, name, order, text, layer, key)
        return scope_handle, layer

    def _owned(self, owner: str) -> int:
        """How many live registrations `owner` has (against its quota)."""
        return len(self._by_owner.get(owner, ()))

    def _added(self, entry: E, handle: ScopeHandle | None) -> E:
        self._entries[entry.id] = entry
        self._by_owner.setdefault(entry.owner, {})[entry.id] = entry
        self._admission.admitted(entry)
        if handle is not None:
            handle.children[entry.id] = entry
        entry.fingerprint = self._fingerprints.of(entry.kind, entry.value)
        self._publish(entry, Action.REGISTERED)
        return entry

    def _unlink(self, entry: AnyRegistration) -> None:
        """Take `entry` out of where it lives, found by what it is (no remover is kept per
        entry: a closure each cost more than the entry itself)."""
        if isinstance(entry, ListenerRegistration | RuleRegistration):
            self._listeners.remove(entry)
        elif isinstance(entry, ScopeHandle):
            self._scopes.close(entry.name)
        else:
            self._layers.remove(entry)

    def _publish(
        self, entry: AnyRegistration, action: Action, reason: str = ""
    ) -> tuple[str | None, ...]:
        """Say `entry` changed; returns the layers that changed (None: the global one)."""
        fingerprint = "" if action is Action.UNREGISTERED else entry.fingerprint
        rebound = self._scopes.rebound()  # a scope handle's: keys whose chain it changed
        event = self.changes.publish_entry(entry, action, fingerprint, reason, rebound)
        return self.layer_revisions.published(entry, event.revision, self._scopes.knows, rebound)


def _key(handle: ScopeHandle | None) -> str | None:
    return None if handle is None else handle.name
