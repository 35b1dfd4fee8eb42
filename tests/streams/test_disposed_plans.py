"""A disposed listener's stream is freed at once: the plans kept for the scopes it was in
go with the disposal, not when those scopes are assembled again or evicted."""

from __future__ import annotations

import gc
import weakref

import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, eventually, listener_streams, marking


@pytest.mark.parametrize("disposing", ["the listener", "its scope", "its session"])
@pytest.mark.parametrize("global_", [False, True])
async def test_a_disposed_listener_s_stream_is_not_kept_by_a_plan(
    sidecar: Sidecar, connect: ClientFactory, disposing: str, global_: bool
) -> None:
    owner, assembler = await connect(), await connect()
    scope = await owner.scope("agent")
    off = await scope.on_assemble(marking, global_=global_)
    child = await owner.scope("agent/child", parent="agent")
    await child.section("own", 1, "the child's own")
    for key in ["agent", "agent/child", None]:  # a plan kept for each, holding it
        assembly = await assembler.assemble(scope=key)
        assert ("mark" in [part.name for part in assembly.sections]) is (global_ or key is not None)
    (stream,) = listener_streams(sidecar)
    held = weakref.ref(stream)
    del stream
    if disposing == "the listener":
        await off()
    elif disposing == "its scope":
        await scope.dispose()
    else:
        await owner.close()
    await eventually(lambda: not listener_streams(sidecar), "the listener is disposed")
    gc.collect()
    assert held() is None, "a kept plan still holds the disposed listener's stream"
