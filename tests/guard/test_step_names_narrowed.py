"""The step names an open watch shows follow its credential through a reload: a reload that
narrows a credential which may still watch (docs/operations.md, "Trust model") leaves the
stream open, and from then on shows it a step held outside its new scopes without its
name, as a watch opened after the reload would. Before, the names a watch showed were
decided when it opened: a reader narrowed from '*' to one scope kept being told every
step's name on the watch it had open."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp

from guard.test_revocation import TOKENS, Revocable, revocable  # noqa: F401 (a fixture)


async def passes(assembly: object, context: object, next_: dsp.Next) -> object:
    return await next_()


async def test_a_narrowed_readers_open_watch_no_longer_names_steps_it_lost(
    revocable: Revocable,  # noqa: F811 (the fixture imported above)
) -> None:
    address = revocable.sidecar.address
    async with (
        dsp.connect(address, token=TOKENS["admin"]) as admin,
        dsp.connect(address, token=TOKENS["reader"]) as reader,
    ):
        await admin.scope("agent")
        other = await admin.scope("other")
        stream = await reader.watch_changes("agent", ancestors=True, kinds=("listener",))
        try:
            await other.on_assemble(passes, global_=True, name="before-the-reload")
            before = await asyncio.wait_for(anext(stream), 10)
            revocable.reload(["agent", "shared"], ["agent"])  # the reader: '*' -> "agent"
            await other.on_assemble(passes, global_=True, name="after-the-reload")
            after = await asyncio.wait_for(anext(stream), 10)
        finally:
            await stream.close()
    assert isinstance(before, dsp.ChangeEvent) and isinstance(after, dsp.ChangeEvent)
    assert (before.name, before.scope, bool(before.ref)) == ("before-the-reload", "other", True)
    assert (after.name, after.scope, after.ref, after.global_) == ("", None, "", True)
