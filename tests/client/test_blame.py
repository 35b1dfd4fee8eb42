"""A session's providers answer one by one, each judged against its own time: only the one
that was late counts toward ejection (issue 34, item 4)."""

from __future__ import annotations

import asyncio
import logging

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, metric, rejection, section_names, tool, tool_names


def _ejected(sidecar: Sidecar) -> float:
    return metric(sidecar, "dsp_ejected_callbacks_total", kind="provider")


async def _late(_: dsp.AssembleContext) -> str:
    """A provider that does not answer within the 0.3 s these tests give it."""
    await asyncio.sleep(30)
    return "too late"


async def test_a_slow_provider_is_ejected_alone_and_its_instant_neighbours_stay(
    make_sidecar: SidecarFactory,
) -> None:
    # One session, one exchange: two providers that answer at once and one that does not
    # answer within its own 0.3 s. The assembly fails naming the slow one; only it is
    # ejected, and the next assembly has the instant ones' tools and `now`. On main the
    # exchange's timeout was each entry's: all three were ejected.
    sidecar = await make_sidecar(eject_after_timeouts=1)

    async def tools(_: dsp.AssembleContext) -> list[dsp.ToolSchema]:
        return [tool("search")]

    async def now(_: dsp.AssembleContext) -> str:
        return "12:00"

    async with dsp.connect(sidecar.address) as client:
        await client.section("slow", 10, _late, timeout_s=0.3)
        await client.tools(tools)
        await client.variable("now", now)
        error = await rejection(client.assemble(timeout=10), within=10)
        after = await client.assemble(timeout=10)  # before the slow one is made again
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.reason == "PROVIDER_TIMEOUT"
    assert 'section provider "slow"' in str(error)
    assert _ejected(sidecar) == 1
    assert tool_names(after) == ["search"]
    assert "slow" not in section_names(after)
    assert after.variables["now"] == "12:00"


async def test_the_answers_that_came_are_taken_when_an_ignored_provider_is_late(
    make_sidecar: SidecarFactory,
) -> None:
    # Partial answers are taken: of two providers under IGNORE, asked in one exchange, the
    # instant one's text is in the assembly and the late one is named in `skipped` (on
    # main the exchange timed out as a whole: both were skipped).
    sidecar = await make_sidecar(eject_after_timeouts=0)

    async def instant(_: dsp.AssembleContext) -> str:
        return "here"

    async with dsp.connect(sidecar.address) as client:
        await client.section(
            "late", 10, _late, timeout_s=0.3, failure_policy=dsp.FailurePolicy.IGNORE
        )
        await client.section("instant", 20, instant, failure_policy=dsp.FailurePolicy.IGNORE)
        assembly = await client.assemble(timeout=10)
    assert [s.text for s in assembly.sections if s.name == "instant"] == ["here"]
    assert [(s.name, s.reason) for s in assembly.skipped] == [("late", "PROVIDER_TIMEOUT")]


async def test_an_answer_over_max_message_bytes_fails_its_assembly_and_the_session_lives(
    make_sidecar: SidecarFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # A 5 MB answer would be a message over the sidecar's max_message_bytes (4 MiB), which
    # ended the whole session on main, disposing every registration, with nothing logged:
    # the client sends its provider's error instead, the assembly fails naming it, the
    # sidecar logs it, and the session keeps its registrations.
    sidecar = await make_sidecar()
    huge = "x" * (5 * 1024 * 1024)

    async def dump(_: dsp.AssembleContext) -> str:
        return huge

    async with dsp.connect(sidecar.address) as client:
        session_id = client.session_id
        await client.section("kept", 5, "still here")
        handle = await client.section("dump", 10, dump)
        with caplog.at_level(logging.WARNING):
            error = await rejection(client.assemble(timeout=10), within=10)
        await handle()
        after = await client.assemble(timeout=10)
        assert client.session_id == session_id
    assert error.reason == "PROVIDER_FAILED"
    assert 'section provider "dump"' in str(error)
    assert "is over the largest message the sidecar reads" in str(error)
    assert "kept" in section_names(after)
    logged = [record.getMessage() for record in caplog.records]
    assert any("answered" in line and "over the largest message read" in line for line in logged), (
        logged
    )
