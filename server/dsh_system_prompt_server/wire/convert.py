"""Registry values <-> protobuf messages: requests, provider calls, change events, listings.

The assembly's encodings are in `encoding`, the reports' messages in `report_messages`.
`ProvideRequests` joins a session's provide requests from kept encodings of a plan's calls
and context.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_core import Reason

from ..registry import (
    SIDECAR_OWNER,
    Action,
    AnyRegistration,
    AssembleContext,
    CachePolicy,
    ChangeEvent,
    ContextRegistration,
    Dynamic,
    Failure,
    FailurePolicy,
    Filter,
    Kind,
    Limits,
    Missed,
    ProvidedValue,
    ProviderCall,
    ProviderHost,
    Rule,
    SectionRegistration,
    ServiceError,
    Skipped,
    Status,
    Tool,
    ToolSet,
    everywhere_step,
    owner_label,
    public_ref,
    value_bytes,
)
from .encoding import delimited, tool_to_proto
from .json_text import load_json
from .status import bad_request


def tool_from_proto(message: pb.ToolSchema) -> Tool:
    check_parameters(message.name, message.parameters_json)
    return Tool(
        name=message.name,
        description=message.description,
        parameters_json=message.parameters_json,
    )


def toolset_from_proto(message: pb.ToolProviderResult, limits: Limits) -> ToolSet:
    """Tools from a registration, an update or a provider, counted before any is read."""
    limits.check_count("tool schemas", len(message.schemas))
    limits.check_count("tool known_names", len(message.known_names.names))
    known = tuple(message.known_names.names) if message.HasField("known_names") else None
    return ToolSet(schemas=tuple(tool_from_proto(t) for t in message.schemas), known_names=known)


def context_to_proto(context: AssembleContext) -> pb.AssembleContext:
    return pb.AssembleContext(scope=context.scope or "", fields_json=context.fields_json)


def context_from_proto(message: pb.AssembleContext, limits: Limits) -> AssembleContext:
    """The context of an assembly; its fields bounded in size before they are parsed (once:
    the context keeps them parsed for the rules that read them)."""
    fields_json = message.fields_json
    fields = None
    if fields_json:
        limits.check_fields(fields_json)
        fields = parsed_fields(fields_json)
    return AssembleContext(scope=message.scope or None, fields_json=fields_json, fields=fields)


@functools.lru_cache(maxsize=64)
def parsed_fields(fields_json: str) -> dict[str, Any]:
    """Assemble fields, which must be a JSON object; the texts found valid lately are not
    parsed again (64 at most: 4 MiB under the default max_fields_bytes). Read only: the
    same object answers every context with the same text."""
    fields = load_json(fields_json, "assemble fields")
    if not isinstance(fields, dict):
        raise bad_request(Reason.INVALID_JSON, "assemble fields must be a JSON object")
    return fields


def check_parameters(name: str, parameters_json: str) -> None:
    """Tool parameters must be a JSON object (kept as text, never re-encoded)."""
    parameters = load_json(parameters_json, f'tool "{name}" parameters', constants=False)
    if not isinstance(parameters, dict):
        raise bad_request(Reason.INVALID_JSON, f'tool "{name}" parameters must be a JSON object')


# -- registration requests ------------------------------------------------------------


def text_from_proto(
    request: pb.RegisterSectionRequest | pb.RegisterContextRequest, host: ProviderHost
) -> str | Dynamic:
    """A section's or context's text: static, or provided by `host` at each assembly."""
    source = request.WhichOneof("text_source")
    if source == "dynamic":
        return dynamic_from_proto(request.dynamic, host)
    return _static(source, request.text)


def variable_from_proto(
    request: pb.RegisterVariableRequest, host: ProviderHost
) -> str | Dynamic | None:
    source = request.WhichOneof("value_source")
    if source == "dynamic":
        return dynamic_from_proto(request.dynamic, host)
    if source == "no_value":
        return None
    return _static(source, request.value)


def tools_from_proto(
    request: pb.RegisterToolsRequest, host: ProviderHost, limits: Limits
) -> ToolSet | Dynamic:
    source = request.WhichOneof("source")
    if source is None:
        raise bad_request(Reason.MISSING_VALUE, "tools need a static result or a dynamic provider")
    if source == "dynamic":
        return dynamic_from_proto(request.dynamic, host)
    return toolset_from_proto(request.result, limits)


def update_value_from_proto(
    request: pb.UpdateRequest, limits: Limits
) -> str | None | ToolSet | pb.RuleSpec:
    """An update's new static value: text (or a variable's value), no value, tools, or a
    rule's definition (which the registry compiles)."""
    case = request.WhichOneof("value")
    if case is None:
        raise bad_request(Reason.MISSING_VALUE, "an update needs a new value")
    if case == "tools":
        return toolset_from_proto(request.tools, limits)
    if case == "rule":
        return request.rule
    return request.text if case == "text" else None


def dynamic_from_proto(dynamic: pb.Dynamic, host: ProviderHost) -> Dynamic:
    if not dynamic.provider_key:
        raise bad_request(Reason.MISSING_VALUE, "a dynamic provider needs a provider_key")
    cache = cache_from_proto(dynamic.cache)
    return Dynamic(
        host=host,
        key=dynamic.provider_key,
        cache=cache,
        timeout_s=timeout_from_proto(dynamic.timeout_s),
        failure_policy=failure_policy_from_proto(dynamic.failure_policy),
    )


def failure_policy_from_proto(value: int) -> FailurePolicy:
    """IGNORE only when asked for by name; unspecified, FAIL, or a value this sidecar does
    not know (a newer client's) is FAIL, the spec's fail-loud, as unknown enum values are
    the unspecified one throughout the protocol."""
    return FailurePolicy.IGNORE if value == pb.FAILURE_POLICY_IGNORE else FailurePolicy.FAIL


def timeout_from_proto(timeout_s: float) -> float | None:
    """A callback's own timeout; None (the sidecar's provider_timeout_s) unless it is a
    positive number."""
    return timeout_s if math.isfinite(timeout_s) and timeout_s > 0 else None


_CACHE_DEPENDENCIES = {pb.CACHE_DEPENDENCY_REVISION: False, pb.CACHE_DEPENDENCY_CONTEXT: True}


def cache_from_proto(policy: pb.CachePolicy) -> CachePolicy | None:
    """A callback's cache policy; None (asked every time) without a dependency this
    sidecar knows. A time to live that is not a positive number is no limit."""
    by_context = _CACHE_DEPENDENCIES.get(policy.depends_on)
    if by_context is None:
        return None
    ttl = policy.ttl_s if math.isfinite(policy.ttl_s) and policy.ttl_s > 0 else None
    return CachePolicy(by_context=by_context, ttl_s=ttl)


def _static(source: str | None, text: str) -> str:
    if source is None:
        raise bad_request(Reason.MISSING_VALUE, "a static value or a dynamic provider is required")
    return text


# -- provider calls -------------------------------------------------------------------

# A provide request's calls (provider key, kind) and context: what its kept bytes encode.
_ProvideKey = tuple[tuple[tuple[str, Kind], ...], AssembleContext]
PROVIDE_REQUESTS_BYTES = 4 * 1024 * 1024  # the encoded provide requests kept, together
_KEPT_ENTRY_BYTES = 120  # per kept key part: the dict slot, a tuple's or a call's header
_PROVIDE = pb.OpenSessionResponse.DESCRIPTOR.fields_by_name["provide"].number
_PROVIDER_KINDS = {
    Kind.SECTION: pb.PROVIDER_KIND_SECTION,
    Kind.CONTEXT: pb.PROVIDER_KIND_CONTEXT,
    Kind.TOOLS: pb.PROVIDER_KIND_TOOLS,
    Kind.VARIABLE: pb.PROVIDER_KIND_VARIABLE,
}
_EXPECTED_CASES = {
    Kind.SECTION: ("text",),
    Kind.CONTEXT: ("text",),
    Kind.TOOLS: ("tools",),
    Kind.VARIABLE: ("variable_value", "no_value"),
}


class ProvideRequests:
    """ProvideRequests (as the OpenSessionResponse that carries them) encoded by joining:
    what a plan's assemblies ask one host for a context (its calls and the context) is
    encoded once and kept, for every session alike (the bytes depend on nothing else);
    the call's id, timeout and trace context are encoded on their own and joined on.

    Kept: at most `size` encodings, `max_bytes` together; least recently used first out.
    """

    def __init__(self, size: int = 256, max_bytes: int = PROVIDE_REQUESTS_BYTES) -> None:
        self._size = size
        self._max_bytes = max_bytes
        self.bytes = 0
        self._kept: OrderedDict[_ProvideKey, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def encode(
        self,
        call_id: int,
        calls: Sequence[ProviderCall],
        context: AssembleContext,
        timeout: float | None,
        trace_context: Mapping[str, str],
    ) -> bytes:
        """One ProvideRequest asking a session for every value in `calls`."""
        key = (tuple([(call.key, call.kind) for call in calls]), context)  # what is encoded
        body = self._kept.get(key)
        if body is None:
            body = self._keep(key)
        else:
            self._kept.move_to_end(key)
        head = pb.ProvideRequest(call_id=call_id, timeout_s=timeout or 0.0)
        if trace_context:
            head.trace_context.update(trace_context)
        return delimited(_PROVIDE, head.SerializeToString() + body)

    def _keep(self, key: _ProvideKey) -> bytes:
        calls, context = key
        body = pb.ProvideRequest(
            context=context_to_proto(context),
            calls=[pb.ProvideCall(provider_key=k, kind=_PROVIDER_KINDS[kind]) for k, kind in calls],
        ).SerializeToString()
        size = len(body) + len(context.fields_json) + _KEPT_ENTRY_BYTES * (1 + len(calls))
        if size <= self._max_bytes:  # else asked for again each time, never kept
            self._kept[key] = body
            self.bytes += size
            while len(self._kept) > self._size or self.bytes > self._max_bytes:
                self._drop()
        return body

    def _drop(self) -> None:
        (calls, context), body = self._kept.popitem(last=False)
        self.bytes -= len(body) + len(context.fields_json) + _KEPT_ENTRY_BYTES * (1 + len(calls))


def provided_from_proto(
    calls: Sequence[ProviderCall],
    response: pb.ProvideResponse,
    limits: Limits,
    partial: bool = False,
) -> dict[str, ProvidedValue | Failure]:
    """Each call's value from a session's answer; a missing or wrong one is its provider's
    failure (the assembly decides what it means: its failure policy's). A `partial` answer
    (one of several, provider by provider) gives only the values it holds."""
    if len(response.values) > len(calls):  # more than asked: nothing to read past the count
        raise _provider_failed(
            calls[0], f"it sent {len(response.values)} answers to {len(calls)} calls"
        )
    answers = {value.provider_key: value for value in response.values}
    values: dict[str, ProvidedValue | Failure] = {}
    for call in calls:
        answer = answers.get(call.key)
        case = None if answer is None else answer.WhichOneof("value")
        if answer is None and partial:
            continue  # in another of its answers, or late
        if answer is None:
            values[call.key] = _provider_failed(call, "it gave no answer")
        elif case == "error" and answer.error.answer_bytes:
            why = f"its answer of {answer.error.answer_bytes} bytes is over the largest message"
            values[call.key] = _provider_failed(call, f"{why} the sidecar reads")
        elif case == "error":
            values[call.key] = _provider_failed(call, answer.error.message)
        elif case not in _EXPECTED_CASES[call.kind]:
            why = f"it answered {case or 'nothing'} instead of {call.kind.value}"
            values[call.key] = _provider_failed(call, why)
        else:
            values[call.key] = _provided_value(call, answer, limits)
    return values


def _provided_value(
    call: ProviderCall, answer: pb.ProvidedValue, limits: Limits
) -> ProvidedValue | Failure:
    if call.kind is Kind.TOOLS:
        try:
            return toolset_from_proto(answer.tools, limits)
        except Failure as error:
            return _provider_failed(call, error.message)
    if answer.HasField("no_value"):
        return None
    return answer.text if call.kind in (Kind.SECTION, Kind.CONTEXT) else answer.variable_value


def _provider_failed(call: ProviderCall, message: str) -> ServiceError:
    return ServiceError(
        Status.ABORTED, Reason.PROVIDER_FAILED, f"{call.describe()} failed: {message}"
    )


# -- change events --------------------------------------------------------------------

_CHANGE_KINDS = {
    Kind.SECTION: pb.CHANGE_KIND_SECTION,
    Kind.CONTEXT: pb.CHANGE_KIND_CONTEXT,
    Kind.TOOLS: pb.CHANGE_KIND_TOOLS,
    Kind.VARIABLE: pb.CHANGE_KIND_VARIABLE,
    Kind.SUPPRESSOR: pb.CHANGE_KIND_SUPPRESSOR,
    Kind.LISTENER: pb.CHANGE_KIND_LISTENER,
    Kind.SCOPE: pb.CHANGE_KIND_SCOPE,
    Kind.CONFIG: pb.CHANGE_KIND_CONFIG,
    Kind.RULE: pb.CHANGE_KIND_RULE,
}


_CHANGE_ACTIONS = {
    Action.REGISTERED: pb.CHANGE_ACTION_REGISTERED,
    Action.UNREGISTERED: pb.CHANGE_ACTION_UNREGISTERED,
    Action.UPDATED: pb.CHANGE_ACTION_UPDATED,
}


def change_to_proto(item: ChangeEvent | Missed) -> pb.WatchChangesResponse:
    if isinstance(item, Missed):
        return pb.WatchChangesResponse(missed=_missed_to_proto(item))
    return pb.WatchChangesResponse(event=_event_to_proto(item))


def batch_to_proto(
    items: Sequence[ChangeEvent | Missed], encoded: Callable[[ChangeEvent], bytes]
) -> pb.WatchChangesResponse:
    """Consecutive events in one message; a gap, if any, is the last item.

    Every watcher sends the same events: `encoded` gives each one's `batch_entry`,
    made once, and the batch is parsed from them joined, not built field by field.
    """
    entries = [encoded(item) for item in items if not isinstance(item, Missed)]
    batch = pb.ChangeBatch.FromString(b"".join(entries))
    if items and isinstance(items[-1], Missed):
        batch.missed.CopyFrom(_missed_to_proto(items[-1]))
    return pb.WatchChangesResponse(batch=batch)


def batch_entry(event: ChangeEvent) -> bytes:
    """`event` encoded as one entry of ChangeBatch.events (joined entries parse as a batch)."""
    return pb.ChangeBatch(events=[_event_to_proto(event)]).SerializeToString()


def _missed_to_proto(item: Missed) -> pb.ChangesMissed:
    return pb.ChangesMissed(
        first_missed_revision=item.first_revision,
        count=item.count,
        resync_revision=item.resync_revision,
    )


def _event_to_proto(item: ChangeEvent) -> pb.ChangeEvent:
    return pb.ChangeEvent(
        revision=item.revision,
        kind=_CHANGE_KINDS[item.kind],
        action=_CHANGE_ACTIONS[item.action],
        name=item.name,
        scope=item.scope or "",
        ref=item.ref,
        fingerprint=item.fingerprint,
        reason=item.reason,
        rebound_scopes=item.rebound,
        **{"global": item.scope is None or item.everywhere},  # a Python keyword
    )


_KINDS_BY_WIRE = {wire: kind for kind, wire in _CHANGE_KINDS.items()}
BUILTIN_OWNER = "dsh-system-prompt"  # the owner name of the sidecar's own sections


def filter_from_proto(message: pb.ChangeFilter, limits: Limits) -> Filter:
    """A watch's or listing's filter; kinds this sidecar does not know are ignored."""
    limits.check_name("scope", message.scope)
    limits.check_count("change filter kinds", len(message.kinds))
    kinds = frozenset(_KINDS_BY_WIRE[k] for k in message.kinds if k in _KINDS_BY_WIRE)
    return Filter(scope=message.scope or None, ancestors=message.ancestors, kinds=kinds)


def registration_to_proto(
    entry: AnyRegistration, owner: str, with_value: bool, sizes: bool = True
) -> pb.RegistrationInfo:
    """One registration as a listing shows it; its value only when asked for; a variable's
    size only with `sizes` (the caller may see values: a short secret's exact length
    narrows the guesses)."""
    everywhere = everywhere_step(entry)
    builtin = entry.owner == SIDECAR_OWNER
    info = pb.RegistrationInfo(
        ref=public_ref(entry.id),
        kind=_CHANGE_KINDS[entry.kind],
        name=entry.name,
        scope=entry.scope or "",
        complete=isinstance(entry, SectionRegistration) and entry.complete,
        dynamic=isinstance(entry.value, Dynamic) or entry.kind is Kind.LISTENER,
        owner=BUILTIN_OWNER if builtin else owner,
        owner_label="built-in" if builtin else owner_label(entry.owner),
        size_bytes=value_bytes(entry.value) if sizes or entry.kind is not Kind.VARIABLE else 0,
        fingerprint=entry.fingerprint,
    )
    setattr(info, "global", everywhere)  # a Python keyword
    if isinstance(entry, SectionRegistration | ContextRegistration):
        info.order = entry.order
    if with_value and entry.fingerprint:
        info.value.CopyFrom(_registered_value(entry.value))
    return info


def anonymous_registration(entry: AnyRegistration) -> pb.RegistrationInfo:
    """A step as a listing shows it to a caller not shown its name (filters.anonymous): its
    kind, and its layer unless it runs everywhere."""
    everywhere = everywhere_step(entry)
    info = pb.RegistrationInfo(
        kind=_CHANGE_KINDS[entry.kind],
        scope="" if everywhere else entry.scope or "",
        dynamic=entry.kind is Kind.LISTENER,
    )
    setattr(info, "global", everywhere)  # a Python keyword
    return info


def _registered_value(value: object) -> pb.RegisteredValue:
    if isinstance(value, Rule):
        return pb.RegisteredValue(rule=value.spec)
    if isinstance(value, ToolSet):
        return pb.RegisteredValue(tools=toolset_to_proto(value))
    if isinstance(value, str):
        return pb.RegisteredValue(text=value)
    return pb.RegisteredValue(no_value=pb.NoValue())


def toolset_to_proto(tools: ToolSet) -> pb.ToolProviderResult:
    message = pb.ToolProviderResult(schemas=[tool_to_proto(tool) for tool in tools.schemas])
    if tools.known_names is not None:
        message.known_names.names.extend(tools.known_names)
    return message


# -- skipped steps ----------------------------------------------------------------------

SKIPPED_TRAILER = "dsh-skipped-steps"
_TRAILER_STEPS = 32  # listed in the trailer; more are counted (`+N`), the response has all


def skipped_to_proto(step: Skipped) -> pb.SkippedStep:
    return pb.SkippedStep(
        kind=_CHANGE_KINDS[step.kind],
        name=step.name,
        scope=step.scope or "",
        ref=public_ref(step.registration_id),
        reason=step.reason,
        message=step.message,
    )


def change_kind_to_proto(kind: Kind) -> pb.ChangeKind.ValueType:
    return _CHANGE_KINDS[kind]


def skipped_trailer(steps: Sequence[Skipped]) -> str:
    """`kind:ref:REASON` per skipped step, comma-separated (ASCII, whatever the names):
    `listener:3f9ac1d2e4b5a697:LISTENER_TIMEOUT,section:0b1c...:PROVIDER_FAILED`."""
    listed = [f"{s.kind.value}:{public_ref(s.registration_id)}:{s.reason}" for s in steps]
    if len(listed) > _TRAILER_STEPS:
        listed[_TRAILER_STEPS:] = [f"+{len(listed) - _TRAILER_STEPS}"]
    return ",".join(listed)
