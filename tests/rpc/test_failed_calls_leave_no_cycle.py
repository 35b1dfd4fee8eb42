"""A unary call that fails ends with its status set on its context (wire/handlers.py
`ending`), not gRPC's raised abort, which kept each failed call's state (its RPCState,
context and a dozen frames) in a reference cycle with the exception until a full garbage
collection: a flood's refused calls made those 50-95 ms long. Each test fails with the
raised abort; the clients still get the status, with its reason."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from guard.test_fair_shares import credentials
from helpers import SidecarFactory, garbage_left, raw_channel, raw_stub

CALL_STATE = {"RPCState", "AbortError", "_ServicerContext"}
REASON_TRAILER = "dsh-error-reason"
WRONG = (("authorization", "Bearer not-a-token-of-this-sidecar"),)


async def _left_for_the_collector(
    sidecar: Sidecar,
    call: Callable[[grpc.aio.Channel], Awaitable[object]],
    code: grpc.StatusCode,
    reason: str,
) -> set[str]:
    """The types of call state that 20 failed calls left in cycles, each failing as told."""
    async with raw_channel(sidecar.address) as channel:

        async def fail() -> None:
            for _ in range(20):
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await call(channel)
                assert failed.value.code() == code
                assert dict(failed.value.trailing_metadata() or ())[REASON_TRAILER] == reason

        return {type(thing).__name__ for thing in await garbage_left(fail)} & CALL_STATE


async def test_a_call_refused_its_credential_leaves_no_cycle(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await make_sidecar(**credentials(tmp_path))
    request = pb.AssembleRequest(context=pb.AssembleContext(scope="light"))
    left = await _left_for_the_collector(
        sidecar,
        lambda channel: raw_stub(channel).Assemble(request, metadata=WRONG),
        grpc.StatusCode.UNAUTHENTICATED,
        "UNAUTHENTICATED",
    )
    assert not left


def _failed_assembly(channel: grpc.aio.Channel) -> Awaitable[object]:
    bad_fields = pb.AssembleContext(fields_json="[not json")
    sent: Awaitable[object] = raw_stub(channel).Assemble(pb.AssembleRequest(context=bad_fields))
    return sent


def _refused_registration(channel: grpc.aio.Channel) -> Awaitable[object]:
    request = pb.RegisterSectionRequest(session_id="no-such-session", name="s", text="t")
    sent: Awaitable[object] = raw_stub(channel).RegisterSection(request)
    return sent


@pytest.mark.parametrize(
    ("call", "code", "reason"),
    [
        (_failed_assembly, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_JSON"),
        (_refused_registration, grpc.StatusCode.FAILED_PRECONDITION, "UNKNOWN_SESSION"),
    ],
    ids=["a failed assembly", "a refused registration"],
)
async def test_a_failed_call_leaves_no_cycle(
    sidecar: Sidecar,
    call: Callable[[grpc.aio.Channel], Awaitable[object]],
    code: grpc.StatusCode,
    reason: str,
) -> None:
    assert not await _left_for_the_collector(sidecar, call, code, reason)


async def test_a_request_that_does_not_parse_leaves_no_cycle(sidecar: Sidecar) -> None:
    def dispose_of_bytes(channel: grpc.aio.Channel) -> Awaitable[object]:
        method = channel.unary_unary(
            "/dsh.systemprompt.v1.SystemPromptService/Dispose",
            request_serializer=bytes,
            response_deserializer=bytes,
        )
        sent: Awaitable[object] = method(b"\xff\xff\xff")  # no DisposeRequest
        return sent

    left = await _left_for_the_collector(
        sidecar, dispose_of_bytes, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_VALUE"
    )
    assert not left
