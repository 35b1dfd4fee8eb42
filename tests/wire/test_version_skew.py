"""Version skew: the current client with an older and a newer (scripted) sidecar, and the
current sidecar with an older client written on raw stubs. Each side uses only what both
support and ignores what it does not know (docs/protocol.md, "Versions and features")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import raw_channel, raw_stub
from scripted import (
    Peer,
    Script,
    ScriptedSidecar,
    connect,
    fail,
    invocation,
    next_result,
    opened,
    registered,
    taken,
    wire_tool,
    with_unknown_field,
)

grpc_max_workers = 32  # pytest-grpc: each open stream of the scripted sidecar holds a thread


class Older(Script):
    """The release before feature negotiation: no versions, no features, and every
    next_result slot-encoded whether asked or not."""

    def open_session(self, peer: Peer) -> Iterator[pb.OpenSessionResponse]:
        peer.start = peer.take()
        yield opened(self.new_id("session-"))
        yield from peer.outgoing()

    def listen(self, peer: Peer) -> Iterator[pb.ListenResponse]:
        peer.start = peer.take()
        yield registered(self.new_id("listener-"))
        yield from peer.outgoing()


async def test_an_older_sidecar_gets_full_tools_and_its_slots_are_still_read(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Older()
    seen: list[list[str]] = []

    async def adds_a_tool(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> dsp.PromptAssembly:
        assembly.tools.append(dsp.ToolSchema("mine", "added here", {}))
        result: dsp.PromptAssembly = await next_()
        seen.append([tool.name for tool in result.tools])
        return result

    async with connect(scripted) as client:
        await client.on_assemble(adds_a_tool)
        stream = scripted.script.listeners[0]
        stream.outbox.put(invocation(1, wire_tool("t0"), wire_tool("t1")))
        sent_next = (await taken(stream)).next
        # Slot-encoded, as that release always did: t1 unchanged, then one new tool.
        stream.outbox.put(next_result(1, [1, -1], wire_tool("late")))
        result = (await taken(stream)).result
    assert list(sent_next.tool_slots) == [] and list(result.tool_slots) == []
    assert [t.name for t in sent_next.assembly.tools] == ["t0", "t1", "mine"]
    assert seen == [["t1", "late"]]
    assert [t.name for t in result.assembly.tools] == ["t1", "late"]


async def test_an_older_sidecar_without_versions_or_features_serves_a_client(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Older()
    async with connect(scripted) as client:
        await client.section("s", 1, "text")
        assert client.session_id
        start = scripted.script.sessions[0].start.start
    assert start.client_version.startswith("dsh-system-prompt-python/")


class Newer(Script):
    """A later release: features, fields, message kinds and values this client lacks."""

    session_features = ("tool-slots", "delta-hops", "something-else")
    listener_features = ("tool-slots", "delta-hops")

    def open_session(self, peer: Peer) -> Iterator[pb.OpenSessionResponse]:
        peer.start = peer.take()
        first = opened(
            self.new_id("session-"),
            sidecar_version="dsh-system-prompt/99.0",
            features=list(self.session_features),
        )
        yield with_unknown_field(first)
        yield with_unknown_field(pb.OpenSessionResponse(), number=60)  # a new kind of message
        yield from peer.outgoing()

    def listen(self, peer: Peer) -> Iterator[pb.ListenResponse]:
        peer.start = peer.take()
        yield with_unknown_field(
            registered(self.new_id("listener-"), features=list(self.listener_features))
        )
        yield with_unknown_field(pb.ListenResponse(), number=60)
        yield from peer.outgoing()

    def watch(self, peer: Peer) -> Iterator[pb.WatchChangesResponse]:
        yield pb.WatchChangesResponse(subscribed=pb.WatchSubscribed(revision=10))
        yield with_unknown_field(pb.WatchChangesResponse(), number=60)
        yield from peer.outgoing()

    def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
        if method == "Assemble" and request.render:
            fail(context, grpc.StatusCode.FAILED_PRECONDITION, "new rule", "A_NEWER_REASON")
        return with_unknown_field(super().answer(method, request, context))


async def test_a_newer_sidecar_s_unknown_features_fields_and_messages_are_ignored(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Newer()

    async def keeps_tools(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> dsp.PromptAssembly:
        result: dsp.PromptAssembly = await next_()
        return result

    async with connect(scripted) as client:
        await client.section("s", 1, lambda ctx: "value")
        await client.on_assemble(keeps_tools)
        session, stream = scripted.script.sessions[0], scripted.script.listeners[0]
        call = pb.ProvideCall(provider_key="p1", kind=pb.PROVIDER_KIND_SECTION)
        session.outbox.put(
            with_unknown_field(
                pb.OpenSessionResponse(provide=pb.ProvideRequest(call_id=1, calls=[call]))
            )
        )
        answer = (await taken(session)).provided
        stream.outbox.put(with_unknown_field(invocation(1, wire_tool("t0"))))
        sent_next = (await taken(stream)).next
        stream.outbox.put(next_result(1, [0]))
        result = (await taken(stream)).result
        assembly = await client.assemble()
    assert answer.values[0].text == "value"
    # tool-slots is confirmed among unknown features: the client uses it.
    assert list(sent_next.tool_slots) == [0] and list(result.tool_slots) == [0]
    assert assembly == dsp.PromptAssembly([], [], [], {})


async def test_a_newer_sidecar_s_unknown_reason_is_kept_as_its_string(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Newer()
    async with connect(scripted) as client:
        with pytest.raises(dsp.SystemPromptError) as failure:
            await client.render()
    assert (failure.value.code, failure.value.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "A_NEWER_REASON",
    )


async def test_a_newer_sidecar_s_unknown_change_kinds_are_reported_as_unknown(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Newer()
    async with connect(scripted) as client:
        changes = await client.watch_changes()
        event = pb.ChangeEvent(revision=11, name="n")
        event.kind, event.action = 99, 98  # type: ignore[assignment]
        scripted.script.watchers[0].outbox.put(pb.WatchChangesResponse(event=event))
        seen = await asyncio.wait_for(anext(changes), 5)
        await changes.close()
    assert seen == dsp.ChangeEvent(11, "unknown", "unknown", "n", None)


async def test_a_newer_sidecar_s_unknown_provider_kind_is_answered_with_an_error(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = Newer()
    async with connect(scripted) as client:
        await client.section("s", 1, lambda ctx: "text")
        call = pb.ProvideCall(provider_key="p1")
        call.kind = 42  # type: ignore[assignment]
        session = scripted.script.sessions[0]
        session.outbox.put(
            pb.OpenSessionResponse(provide=pb.ProvideRequest(call_id=1, calls=[call]))
        )
        answer = (await taken(session)).provided
    assert "kind 42" in answer.values[0].error.message


async def test_a_newer_sidecar_s_unknown_report_values_are_reported_as_unknown(
    scripted: ScriptedSidecar,
) -> None:
    class Reports(Newer):
        def answer(self, method: str, request: Any, context: grpc.ServicerContext) -> Any:
            reply = super().answer(method, request, context)
            if method == "Assemble":
                part = reply.report.parts.add(name="new")
                part.kind, part.source.kind = 77, 78
            return reply

    scripted.script = Reports()
    async with connect(scripted) as client:
        assembly = await client.assemble(report=True)
    assert assembly.report is not None
    part = assembly.report.parts[0]
    assert (part.kind, part.source.kind, part.name) == ("unknown", "unknown", "new")


# -- the current sidecar and an older client ------------------------------------------


async def test_an_older_client_on_raw_stubs_gets_everything_it_uses(sidecar: Sidecar) -> None:
    """No version, no features, no report fields: the plain protocol, complete."""
    async with raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        session = stub.OpenSession()
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="old")))
        first = await session.read()
        assert first.opened.session_id
        session_id = first.opened.session_id
        await stub.RegisterSection(
            pb.RegisterSectionRequest(
                session_id=session_id, name="dyn", order=1, dynamic=pb.Dynamic(provider_key="k")
            )
        )
        tools = pb.ToolProviderResult(schemas=[wire_tool("t0"), wire_tool("t1")])
        await stub.RegisterTools(pb.RegisterToolsRequest(session_id=session_id, result=tools))
        listen = stub.Listen()
        await listen.write(
            pb.ListenRequest(start=pb.ListenStart(session_id=session_id, name="old"))
        )
        confirmed = (await listen.read()).registered
        assembling = asyncio.ensure_future(stub.Assemble(pb.AssembleRequest(), timeout=10))
        ask = (await session.read()).provide
        await session.write(
            pb.OpenSessionRequest(
                provided=pb.ProvideResponse(
                    call_id=ask.call_id,
                    values=[pb.ProvidedValue(provider_key="k", text="from the old client")],
                )
            )
        )
        invoked = (await listen.read()).invocation
        handed = pb.PromptAssembly()
        handed.CopyFrom(invoked.assembly)
        del handed.tools[0]
        await listen.write(
            pb.ListenRequest(
                next=pb.ListenerNext(invocation_id=invoked.invocation_id, assembly=handed)
            )
        )
        came_back = (await listen.read()).next_result
        await listen.write(
            pb.ListenRequest(
                result=pb.ListenerResult(
                    invocation_id=invoked.invocation_id, assembly=came_back.assembly
                )
            )
        )
        reply = await assembling
        await listen.done_writing()
        await session.done_writing()
        assert await session.read() is grpc.aio.EOF
    assert list(confirmed.features) == []
    assert list(came_back.tool_slots) == []  # never slots to a client that did not ask
    assert [t.name for t in came_back.assembly.tools] == ["t1"]
    assert [t.name for t in reply.assembly.tools] == ["t1"]
    assert "from the old client" in [s.text for s in reply.assembly.sections]
    assert not reply.HasField("report") and not reply.HasField("rendered")
