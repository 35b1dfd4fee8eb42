"""The local cache against a scripted sidecar whose change stream breaks when the test says:
while the stream is down, and after it resyncs, no kept answer is served.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from helpers import eventually
from scripted import CALL_TIMEOUT_S, WAIT_S, End, Peer, Script, ScriptedSidecar

grpc_max_workers = 16  # pytest-grpc: each open stream of the scripted sidecar holds a thread


class Cacheable(Script):
    """Answers every Assemble with one section, `text`, cacheable at `revision`; holds a
    resubscription until `resume` is set, then confirms it with `resumed`."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self.revision = "v1", 10
        self.resume = threading.Event()
        self.resumed = pb.WatchSubscribed(revision=10, incarnation="first")
        self.listing_revision = 10

    def watch(self, peer: Peer) -> Iterator[pb.WatchChangesResponse]:
        if len(self.watchers) == 1:
            yield pb.WatchChangesResponse(
                subscribed=pb.WatchSubscribed(revision=10, incarnation="first")
            )
        else:
            self.resume.wait(WAIT_S)
            yield pb.WatchChangesResponse(subscribed=self.resumed)
        yield from peer.outgoing()

    def list_registrations(
        self, request: pb.ListRegistrationsRequest
    ) -> Iterator[pb.ListRegistrationsResponse]:
        yield pb.ListRegistrationsResponse(
            revision=self.listing_revision, incarnation=self.resumed.incarnation
        )

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        if method != "Assemble":
            return super().answer(method, request, context)
        assembly = pb.PromptAssembly(sections=[pb.AssembledSection(name="rules", text=self.text)])
        return pb.AssembleResponse(assembly=assembly, revision=self.revision, cacheable=True)


def asked(script: Script) -> int:
    return sum(1 for method, _ in script.unary if method == "Assemble")


async def rules(client: dsp.Client) -> str:
    return (await client.assemble()).sections[0].text


@pytest.fixture
async def broken(scripted: ScriptedSidecar) -> AsyncIterator[tuple[Cacheable, dsp.Client]]:
    """A caching client that kept the scripted sidecar's v1, whose change stream then
    broke (its resubscription waits for `script.resume`)."""
    script = scripted.script = Cacheable()
    async with dsp.connect(scripted.address, call_timeout=CALL_TIMEOUT_S, local_cache=True) as c:
        await rules(c)
        assert await rules(c) == "v1" and asked(script) == 1  # the second was kept
        script.watchers[0].outbox.put(End(grpc.StatusCode.UNAVAILABLE, "cut"))
        await eventually(lambda: len(script.watchers) == 2, "the stream resubscribes")
        yield script, c
        script.resume.set()


async def resynced_at_3(script: Cacheable) -> None:
    """Let the stream resubscribe to another incarnation, whose revisions are below the
    kept answer's, and resync from its listing."""
    script.resumed = pb.WatchSubscribed(revision=3, incarnation="second", resync=True)
    script.listing_revision = 3
    script.resume.set()
    await eventually(lambda: listed(script), "the resync's listing")
    await asyncio.sleep(0)  # let the stream hand over its resync


async def test_while_the_change_stream_is_down_no_kept_answer_is_served(
    broken: tuple[Cacheable, dsp.Client],
) -> None:
    script, client = broken
    script.text, script.revision = "v2", 11  # a change the broken stream does not bring
    assert await rules(client) == "v2"


async def test_after_a_resync_no_answer_kept_before_it_is_served(
    broken: tuple[Cacheable, dsp.Client],
) -> None:
    script, client = broken
    await resynced_at_3(script)
    script.text, script.revision = "v2", 3
    assert await rules(client) == "v2"


def listed(script: Script) -> bool:
    return any(method == "ListRegistrations" for method, _ in script.unary)


async def test_after_a_resync_answers_are_kept_again(
    broken: tuple[Cacheable, dsp.Client],
) -> None:
    script, client = broken
    script.revision = 3
    await resynced_at_3(script)
    await eventually(lambda: kept_again(script, client), "an answer kept at revision 3")


async def kept_again(script: Script, client: dsp.Client) -> bool:
    await rules(client)
    before = asked(script)
    await rules(client)
    return asked(script) == before
