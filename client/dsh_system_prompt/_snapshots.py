"""Listings of the registry (ListRegistrations) and the filters that watches share."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc

from ._convert import CHANGE_KIND_WIRE, CHANGE_KINDS, toolset_from_proto
from ._rules import Rule, rule_from_proto
from .errors import error_from_rpc, invalid_value
from .types import ChangeKind, RegistrationInfo, Snapshot, ToolProviderResult


def change_filter(
    scope: str | None, ancestors: bool, kinds: Iterable[ChangeKind] | None
) -> pb.ChangeFilter:
    """The wire filter; an unknown kind is refused here."""
    wire_kinds: list[pb.ChangeKind.ValueType] = []
    for kind in kinds or ():
        if kind not in CHANGE_KIND_WIRE:
            raise invalid_value(f"unknown kind {kind!r}; one of {', '.join(CHANGE_KIND_WIRE)}")
        wire_kinds.append(CHANGE_KIND_WIRE[kind])
    return pb.ChangeFilter(scope=scope or "", ancestors=ancestors, kinds=wire_kinds)


async def list_registrations(
    stub: pb_grpc.SystemPromptServiceStub,
    request: pb.ListRegistrationsRequest,
    timeout: float | None = None,
) -> Snapshot:
    """Read a whole listing (every batch) into one Snapshot."""
    revision, incarnation = 0, ""
    found: list[RegistrationInfo] = []
    try:
        async for batch in stub.ListRegistrations(request, timeout=timeout):
            revision, incarnation = batch.revision, batch.incarnation
            found.extend(map(registration_from_proto, batch.registrations))
    except grpc.RpcError as error:
        raise error_from_rpc(error) from None
    return Snapshot(revision, incarnation, found)


def registration_from_proto(message: pb.RegistrationInfo) -> RegistrationInfo:
    case = message.value.WhichOneof("value") if message.HasField("value") else None
    value: str | ToolProviderResult | Rule | None = None
    if case == "text":
        value = message.value.text
    elif case == "tools":
        value = toolset_from_proto(message.value.tools)
    elif case == "rule":
        value = rule_from_proto(message.value.rule)
    return RegistrationInfo(
        ref=message.ref,
        kind=CHANGE_KINDS.get(message.kind, "unknown"),
        name=message.name,
        scope=message.scope or None,
        order=message.order if message.HasField("order") else None,
        complete=message.complete,
        dynamic=message.dynamic,
        owner=message.owner,
        owner_label=message.owner_label,
        size_bytes=message.size_bytes,
        fingerprint=message.fingerprint,
        has_value=case is not None,
        value=value,
        global_=getattr(message, "global"),  # a Python keyword
    )
