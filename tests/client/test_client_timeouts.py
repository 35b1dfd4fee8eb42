"""The Python client's `timeout_s=`: a provider or listener that declares its own time is
waited for that long instead of provider_timeout_s (docs/protocol.md, "Ejected callbacks")."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientOf, SidecarFactory, metric, rejection, tool

SLOW_S = 1.5  # three times the sidecar's provider_timeout_s below, half the declared time


def _ejected(sidecar: Sidecar) -> float:
    return sum(
        metric(sidecar, "dsp_ejected_callbacks_total", kind=kind)
        for kind in ("provider", "listener")
    )


async def test_providers_that_declare_timeout_s_are_waited_for_past_provider_timeout_s(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)

    async def slow(_: dsp.AssembleContext) -> str:
        await asyncio.sleep(SLOW_S)
        return "late"

    async def slow_tools(_: dsp.AssembleContext) -> list[dsp.ToolSchema]:
        await asyncio.sleep(SLOW_S)
        return [tool("late_tool")]

    async with dsp.connect(sidecar.address) as client:
        await client.section("slow", 1, slow, timeout_s=3)
        await client.context("slow-context", 1, slow, timeout_s=3)
        await client.variable("slow_variable", slow, timeout_s=3)
        await client.tools(slow_tools, timeout_s=3)
        assembly = await client.assemble(timeout=10)
    assert [s.text for s in assembly.sections if s.name == "slow"] == ["late"]
    assert [c.text for c in assembly.contexts if c.name == "slow-context"] == ["late"]
    assert assembly.variables["slow_variable"] == "late"
    assert "late_tool" in [t.name for t in assembly.tools]
    assert _ejected(sidecar) == 0


async def test_a_listener_that_declares_timeout_s_is_waited_for_past_provider_timeout_s(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)

    async def slow(assembly: dsp.PromptAssembly, _: dsp.AssembleContext, next_: Any) -> Any:
        await asyncio.sleep(SLOW_S)
        assembly.variables["signed"] = "late"
        return await next_()

    async with dsp.connect(sidecar.address) as client:
        await client.on_assemble(slow, timeout_s=3)
        assembly = await client.assemble(timeout=10)
    assert assembly.variables["signed"] == "late"
    assert _ejected(sidecar) == 0


async def test_a_timeout_s_over_max_callback_timeout_s_is_refused_and_leaves_nothing(
    client_of: ClientOf,
) -> None:
    async def provider(_: dsp.AssembleContext) -> str:
        return "x"

    async def listener(assembly: dsp.PromptAssembly, _: dsp.AssembleContext, next_: Any) -> Any:
        return await next_()

    async with client_of(max_callback_timeout_s=10) as client:
        refused = [
            await rejection(client.section("s", 1, provider, timeout_s=11)),
            await rejection(client.on_assemble(listener, timeout_s=11)),
        ]
        listing = await client.snapshot()
    assert [(e.code.name, e.reason) for e in refused] == [
        ("INVALID_ARGUMENT", dsp.Reason.VALUE_TOO_LARGE)
    ] * 2
    assert "max_callback_timeout_s" in refused[0].message
    assert [r.name for r in listing.registrations if r.dynamic or r.kind == "listener"] == []


async def test_timeout_s_on_a_static_value_is_refused_in_the_client(client: dsp.Client) -> None:
    refused = [
        await rejection(client.section("static", 1, "text", timeout_s=3)),
        await rejection(client.context("static", 1, "text", timeout_s=3)),
        await rejection(client.variable("static", "value", timeout_s=3)),
        await rejection(client.variable("unset", None, timeout_s=3)),
        await rejection(client.tools([tool("static")], timeout_s=3)),
    ]
    assert {(e.reason, e.message) for e in refused} == {
        (
            dsp.Reason.INVALID_VALUE,
            "timeout_s= applies to a provider (a callable), not to a static value",
        )
    }


@pytest.mark.parametrize("timeout_s", [0, -1, math.nan, math.inf])
async def test_a_timeout_s_that_is_not_a_positive_number_is_refused_in_the_client(
    client: dsp.Client, timeout_s: float
) -> None:
    async def provider(_: dsp.AssembleContext) -> str:
        return "x"

    error = await rejection(client.section("s", 1, provider, timeout_s=timeout_s))
    assert error.reason == dsp.Reason.INVALID_VALUE
    assert "timeout_s must be a positive number" in error.message
