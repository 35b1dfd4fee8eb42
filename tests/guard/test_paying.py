"""What a call sends on other clients' streams is paid for by its own client (issue 34,
the listener burst): an assembly of a client over its share of a busy loop waits for its
turn again before each invocation it hands a listener and before a large response, not
only before the call; the listener's owner waits for nothing of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
from dsh_system_prompt_server.guard.paying import LARGE_RESPONSE_BYTES
from helpers import SidecarFactory

from guard.test_fair_shares import HOG, LIGHT, TOKENS, sharing_sidecar

WIDE = "w" * (LARGE_RESPONSE_BYTES + 1024)  # its assembly's response is a large one


async def _marking(
    assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Callable[[], Awaitable[Any]]
) -> Any:
    assembly.variables["seen_by"] = "light"
    return await next_()


async def test_an_assembly_over_its_share_waits_again_before_its_invocation_and_response(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sharing_sidecar(make_sidecar, tmp_path)
    shares = sidecar.state.shares
    # a long memory (the split holds for the whole test), short waits (each ends soon), and
    # the split recomputed at every look (the in-process call is over within refresh_s)
    settings = dataclasses.replace(shares.settings, window_s=10.0, max_wait_s=0.2, refresh_s=0.0)
    shares.settings = settings
    async with (
        dsp.connect(sidecar.address, token=TOKENS["light"]) as owner,
        dsp.connect(sidecar.address, token=TOKENS["hog"]) as caller,
    ):
        scope = await owner.scope("watched")
        await scope.section("wide", 1, WIDE)
        await scope.on_assemble(_marking)  # the light client's listener
        shares.late(1.0, 1.0)  # as if the loop had run a second late
        shares.charge(HOG, 100.0)  # the caller's client is far over any share
        shares.charge(LIGHT, 1.0)
        before = shares.waits_of(HOG), shares.waits_of(LIGHT)
        assembly = await caller.assemble("watched", timeout=30)
        assert [s.text for s in assembly.sections if s.name == "wide"] == [WIDE]
        # once before the call, once before the invocation of the light client's listener,
        # once before its response of more than LARGE_RESPONSE_BYTES is sent
        assert shares.waits_of(HOG) - before[0] >= 3
        assert shares.waits_of(LIGHT) == before[1]
