"""Updates: a registration's new static value, on the wire and in the replay journal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from google.protobuf.message import Message

from ._convert import tools_to_proto
from ._rules import rule_spec
from .errors import invalid_value


@dataclass(frozen=True)
class Update:
    """What to send, and how to make the registration's request carry the new value."""

    request: pb.UpdateRequest
    apply: Callable[[], None]  # run once the sidecar took it, so a replay registers it


def update_for(registration: Message, value: object) -> Update:
    """The update of the registration made by `registration` to the static `value`.

    A section or context takes a str, a variable a str or None, tools a list
    of ToolSchema or a ToolProviderResult, a rule a `Rule`; anything else is refused here.
    """
    if isinstance(registration, pb.RegisterRuleRequest):
        spec = rule_spec(value)
        return Update(pb.UpdateRequest(rule=spec), lambda: registration.rule.CopyFrom(spec))
    if isinstance(registration, pb.RegisterToolsRequest):
        if callable(value):
            raise _not_static()
        tools = tools_to_proto(value)
        return Update(pb.UpdateRequest(tools=tools), lambda: registration.result.CopyFrom(tools))
    if isinstance(registration, pb.RegisterVariableRequest):
        if value is None:
            return Update(
                pb.UpdateRequest(no_value=pb.NoValue()), registration.no_value.SetInParent
            )
        text = _text(value, "value")
        return Update(pb.UpdateRequest(text=text), lambda: setattr(registration, "value", text))
    text = _text(value, "text")
    return Update(pb.UpdateRequest(text=text), lambda: setattr(registration, "text", text))


def _text(value: object, field: str) -> str:
    if callable(value):
        raise _not_static()
    if not isinstance(value, str):
        raise invalid_value(f"the new {field} must be a str, not {type(value).__name__}")
    return value


def _not_static() -> Exception:
    return invalid_value(
        "update() takes a static value; a provider already gives the latest value at each assembly"
    )
