"""The catalogue of error reasons: the same in the proto and the client, on every error."""

from __future__ import annotations

from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, rejection


def test_the_client_catalogue_is_the_proto_enum() -> None:
    on_the_wire = [name for name in pb.ErrorReason.keys() if name != "ERROR_REASON_UNSPECIFIED"]  # noqa: SIM118
    assert [reason.name for reason in dsp.Reason] == on_the_wire


def test_every_reason_is_its_own_name() -> None:
    assert all(reason.value == reason.name for reason in dsp.Reason)


def test_a_reason_compares_equal_to_its_wire_string() -> None:
    assert dsp.Reason.DUPLICATE_NAME == "DUPLICATE_NAME"


async def test_a_sidecar_error_carries_its_reason_as_a_catalogue_member(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "Be precise.")
    error = await rejection(client.section("rules", 20, "Again."))
    assert error.reason is dsp.Reason.DUPLICATE_NAME


async def test_a_value_refused_in_the_client_has_a_reason(client: dsp.Client) -> None:
    error = await rejection(client.section("rules", "ten", "text"))  # type: ignore[arg-type]
    assert (error.code, error.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        dsp.Reason.INVALID_VALUE,
    )


async def test_a_closed_client_fails_with_session_closed(client: dsp.Client) -> None:
    await client.close()
    error = await rejection(client.section("rules", 10, "text"))
    assert error.reason is dsp.Reason.SESSION_CLOSED


async def test_a_call_without_the_token_is_refused_with_a_reason(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    sidecar: Sidecar = await make_sidecar(auth_token_file=str(token_file))
    with pytest.raises(dsp.SystemPromptError) as failure:
        await dsp.connect(sidecar.address)
    assert (failure.value.code, failure.value.reason) == (
        grpc.StatusCode.UNAUTHENTICATED,
        dsp.Reason.UNAUTHENTICATED,
    )
