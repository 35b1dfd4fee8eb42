"""An exception that is no Failure is a bug of the sidecar's (wire/handlers.py `ending`):
the call ends UNKNOWN as gRPC ends it, and the operator's log says which method failed on
what, with its traceback, once per method and kind of exception each 10 s; the sidecar
serves on."""

from __future__ import annotations

import logging

import dsh_system_prompt as dsp
import pytest
from helpers import SidecarFactory

BUG = "a planted bug"


def _bug(*args: object, **kwargs: object) -> None:
    raise RuntimeError(BUG)


async def test_a_bug_in_a_call_is_logged_with_its_traceback_and_the_call_ends_unknown(
    make_sidecar: SidecarFactory, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR, logger="dsh_system_prompt")
    sidecar = await make_sidecar()
    monkeypatch.setattr(sidecar.state.registry, "register_variable", _bug)
    async with dsp.connect(sidecar.address) as client:
        for _ in range(3):
            with pytest.raises(dsp.SystemPromptError) as failed:
                await client.variable("planted", "value")
            assert failed.value.code.name == "UNKNOWN"
        await client.section("after", 1, "the sidecar serves on")
    records = [r for r in caplog.records if BUG in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in records]  # the next two held back
    (record,) = records
    assert record.getMessage().startswith("RegisterVariable failed on a bug, RuntimeError")
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
