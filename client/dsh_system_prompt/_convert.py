"""Client value types <-> protobuf messages."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from .errors import as_reason, invalid_value
from .types import (
    AssembleContext,
    AssembledContext,
    AssembledSection,
    AssemblyReport,
    ChangeAction,
    ChangeEvent,
    ChangeKind,
    FailurePolicy,
    PartKind,
    PartReport,
    PrefixLayout,
    PrefixStability,
    PromptAssembly,
    Size,
    SkippedStep,
    Source,
    SourceKind,
    ToolFreeze,
    ToolOrderReport,
    ToolProviderResult,
    ToolSchema,
)

CHANGE_KINDS: dict[int, ChangeKind] = {
    pb.CHANGE_KIND_SECTION: "section",
    pb.CHANGE_KIND_CONTEXT: "context",
    pb.CHANGE_KIND_TOOLS: "tools",
    pb.CHANGE_KIND_VARIABLE: "variable",
    pb.CHANGE_KIND_SUPPRESSOR: "suppressor",
    pb.CHANGE_KIND_LISTENER: "listener",
    pb.CHANGE_KIND_SCOPE: "scope",
    pb.CHANGE_KIND_CONFIG: "config",
    pb.CHANGE_KIND_RULE: "rule",
}
CHANGE_KIND_WIRE: dict[str, pb.ChangeKind.ValueType] = {
    kind: pb.ChangeKind.ValueType(wire) for wire, kind in CHANGE_KINDS.items()
}
_CHANGE_ACTIONS: dict[int, ChangeAction] = {
    pb.CHANGE_ACTION_REGISTERED: "registered",
    pb.CHANGE_ACTION_UNREGISTERED: "unregistered",
    pb.CHANGE_ACTION_UPDATED: "updated",
}


def dump_json(value: object, what: str) -> str:
    """Deterministic JSON text; key order is kept so schemas stay byte-identical."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise invalid_value(f"{what} cannot be sent as JSON: {error}") from None


def tool_to_proto(tool: ToolSchema) -> pb.ToolSchema:
    if not isinstance(tool, ToolSchema):
        raise invalid_value(f"expected a ToolSchema, got {type(tool).__name__}")
    parameters_json = tool.parameters_json()
    if parameters_json is None:
        parameters_json = dump_json(tool.parameters, f'tool "{tool.name}" parameters')
    return pb.ToolSchema(
        name=tool.name, description=tool.description, parameters_json=parameters_json
    )


def tools_to_proto(result: object) -> pb.ToolProviderResult:
    """A tool list or ToolProviderResult as sent; anything else is INVALID_ARGUMENT."""
    if isinstance(result, list | tuple):
        result = ToolProviderResult(schemas=list(result))
    if not isinstance(result, ToolProviderResult):
        raise invalid_value(f"expected ToolProviderResult or a list of ToolSchema, got {result!r}")
    message = pb.ToolProviderResult(schemas=[tool_to_proto(t) for t in result.schemas])
    if result.known_names is not None:
        message.known_names.names.extend(result.known_names)
    return message


def toolset_from_proto(message: pb.ToolProviderResult) -> ToolProviderResult:
    known = list(message.known_names.names) if message.HasField("known_names") else None
    return ToolProviderResult(
        schemas=[tool_from_proto(t) for t in message.schemas], known_names=known
    )


def tool_from_proto(message: pb.ToolSchema) -> ToolSchema:
    return ToolSchema.from_json(message.name, message.description, message.parameters_json)


def assembly_from_proto(
    message: pb.PromptAssembly, tools: list[ToolSchema] | None = None
) -> PromptAssembly:
    """The assembly in `message`, converted as it is read; `tools` when the caller
    already decoded them."""
    return PromptAssembly._received(_ReceivedAssembly(message, tools))


class _ReceivedAssembly:
    """A received PromptAssembly message, converted field by field on demand."""

    __slots__ = ("_message", "_tools")

    def __init__(self, message: pb.PromptAssembly, tools: list[ToolSchema] | None) -> None:
        self._message = message
        self._tools = tools

    def convert(self, name: str) -> Any:
        message = self._message
        if name == "sections":
            return [AssembledSection(s.name, s.text) for s in message.sections]
        if name == "contexts":
            return [AssembledContext(c.name, c.text) for c in message.contexts]
        if name == "tools":
            if self._tools is not None:
                return list(self._tools)
            return [tool_from_proto(t) for t in message.tools]
        assert name == "variables", name
        return {v.name: v.value if v.HasField("value") else None for v in message.variables}


def assembly_to_proto(assembly: PromptAssembly) -> pb.PromptAssembly:
    if not isinstance(assembly, PromptAssembly):
        raise invalid_value(
            f"a listener must return a PromptAssembly, not {type(assembly).__name__}"
        )
    return pb.PromptAssembly(
        sections=[pb.AssembledSection(name=s.name, text=s.text) for s in assembly.sections],
        contexts=[pb.AssembledContext(name=c.name, text=c.text) for c in assembly.contexts],
        tools=[tool_to_proto(t) for t in assembly.tools],
        variables=[
            pb.Variable(name=name) if value is None else pb.Variable(name=name, value=value)
            for name, value in assembly.variables.items()
        ],
    )


def context_to_proto(scope: str | None, fields: Mapping[str, Any] | None) -> pb.AssembleContext:
    fields_json = dump_json(dict(fields), "assemble fields") if fields else ""
    return pb.AssembleContext(scope=scope or "", fields_json=fields_json)


def context_from_proto(message: pb.AssembleContext) -> AssembleContext:
    fields = json.loads(message.fields_json) if message.fields_json else {}
    return AssembleContext(scope=message.scope or None, fields=fields)


def change_from_proto(message: pb.ChangeEvent) -> ChangeEvent:
    return ChangeEvent(
        revision=message.revision,
        kind=CHANGE_KINDS.get(message.kind, "unknown"),
        action=_CHANGE_ACTIONS.get(message.action, "unknown"),
        name=message.name,
        scope=message.scope or None,
        ref=message.ref,
        fingerprint=message.fingerprint,
        reason=message.reason,
        rebound_scopes=tuple(message.rebound_scopes),
        global_=getattr(message, "global") if message.HasField("global") else None,
    )


_SOURCE_KINDS: dict[int, SourceKind] = {
    pb.SOURCE_KIND_BUILTIN: "builtin",
    pb.SOURCE_KIND_GLOBAL: "global",
    pb.SOURCE_KIND_SCOPE: "scope",
    pb.SOURCE_KIND_LISTENER: "listener",
    pb.SOURCE_KIND_RULE: "rule",
}
_PART_KINDS: dict[int, PartKind] = {
    pb.PART_KIND_TOOL: "tool",
    pb.PART_KIND_SECTION: "section",
    pb.PART_KIND_CONTEXT: "context",
}


def report_from_proto(message: pb.AssemblyReport) -> AssemblyReport:
    stability = message.stability
    return AssemblyReport(
        tokenizer=message.tokenizer,
        parts=[
            PartReport(
                kind=_PART_KINDS.get(part.kind, "unknown"),
                name=part.name,
                source=_source(part.source),
                bytes=part.bytes,
                tokens=part.tokens if part.HasField("tokens") else None,
                fingerprint=part.fingerprint,
                stable=part.stable,
            )
            for part in message.parts
        ],
        tools=size_from_proto(message.tools),
        prompt=size_from_proto(message.prompt),
        context_snapshot=size_from_proto(message.context_snapshot),
        stability=PrefixStability(
            has_previous=stability.has_previous,
            stable_bytes=stability.stable_bytes,
            stable_tokens=stability.stable_tokens if stability.HasField("stable_tokens") else None,
            prefix=size_from_proto(stability.prefix),
            first_changed=stability.first_changed,
            reason=stability.reason,
            recomputed=size_from_proto(stability.recomputed),
            messages_recomputed=stability.messages_recomputed,
            diff=stability.diff,
            previous_evicted=stability.previous_evicted,
        ),
        variables={v.name: _source(v.source) for v in message.variables},
        render_error=message.render_error,
        prefix_layout=LAYOUTS.get(message.prefix_layout, "system-first"),
        history_key=message.history_key,
        skipped=skipped_from_proto(message.skipped),
        tool_order=_tool_order(message),
    )


def _tool_order(message: pb.AssemblyReport) -> ToolOrderReport | None:
    if not message.HasField("tool_order"):
        return None
    order = message.tool_order
    return ToolOrderReport(order.kept, order.position, order.sorted_tool, order.kept_tool)


FREEZES: dict[str, pb.ToolFreeze.ValueType] = {
    "hold": pb.TOOL_FREEZE_HOLD,
    "release": pb.TOOL_FREEZE_RELEASE,
}


def freeze_to_proto(freeze: ToolFreeze | None) -> pb.ToolFreeze.ValueType:
    if freeze is None:
        return pb.TOOL_FREEZE_UNSPECIFIED
    if freeze not in FREEZES:
        raise invalid_value(f"tool_freeze must be one of hold, release, not {freeze!r}")
    return FREEZES[freeze]


def skipped_from_proto(steps: Iterable[pb.SkippedStep]) -> tuple[SkippedStep, ...]:
    return tuple(
        SkippedStep(
            kind=CHANGE_KINDS.get(step.kind, "unknown"),
            name=step.name,
            scope=step.scope or None,
            ref=step.ref,
            reason=as_reason(step.reason),
            message=step.message,
        )
        for step in steps
    )


LAYOUTS: dict[pb.PrefixLayout.ValueType, PrefixLayout] = {
    pb.PREFIX_LAYOUT_TOOLS_FIRST: "tools-first",
    pb.PREFIX_LAYOUT_SYSTEM_FIRST: "system-first",
}


def layout_to_proto(layout: PrefixLayout | None) -> pb.PrefixLayout.ValueType:
    if layout is None:
        return pb.PREFIX_LAYOUT_UNSPECIFIED
    for wire, name in LAYOUTS.items():
        if name == layout:
            return wire
    known = ", ".join(LAYOUTS.values())
    raise invalid_value(f"prefix_layout must be one of {known}, not {layout!r}")


def _source(message: pb.Source) -> Source:
    return Source(
        kind=_SOURCE_KINDS.get(message.kind, "unknown"),
        scope=message.scope or None,
        ancestor_depth=message.ancestor_depth,
        listener=message.listener,
        rule=message.rule,
        description=message.description,
    )


def size_from_proto(message: pb.Size) -> Size:
    """A size; tokens only when the message carries them."""
    return Size(message.bytes, message.tokens if message.HasField("tokens") else None)


_POLICIES = {
    FailurePolicy.FAIL: pb.FAILURE_POLICY_FAIL,
    FailurePolicy.IGNORE: pb.FAILURE_POLICY_IGNORE,
}


def failure_policy_to_proto(given: object) -> pb.FailurePolicy.ValueType:
    """A callback's or rule's failure policy as sent; anything else is INVALID_VALUE."""
    try:
        policy = FailurePolicy(given)  # type: ignore[arg-type]  # a value is checked here
    except ValueError:
        raise invalid_value(
            f"failure_policy must be dsp.FailurePolicy.FAIL or .IGNORE, not {given!r}"
        ) from None
    return _POLICIES[policy]
