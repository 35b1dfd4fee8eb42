"""A ProvideRequest on the session stream is joined from kept bytes (issue 24, item 1): what a
plan asks one host for a context (its calls and the context) is encoded once, the call's id,
timeout and trace context each time; the session reads the same message as one built whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.registry import AssembleContext, Kind, ProviderCall
from dsh_system_prompt_server.wire.convert import ProvideRequests
from helpers import raw_channel, raw_stub


class RawSession:
    """A session stream held by hand, with two dynamic providers: a section and a variable."""

    def __init__(self, channel: grpc.aio.Channel, prefix: str = "") -> None:
        self.prefix = prefix  # of its registrations' names; its provider keys are its own
        self.stub = raw_stub(channel)
        self.stream = self.stub.OpenSession()
        self.id = ""

    async def open(self) -> None:
        await self.stream.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="raw")))
        self.id = (await self.stream.read()).opened.session_id
        section = pb.RegisterSectionRequest(
            session_id=self.id,
            name=f"{self.prefix}dyn",
            order=1,
            dynamic=pb.Dynamic(provider_key="s"),
        )
        await self.stub.RegisterSection(section)
        variable = pb.RegisterVariableRequest(
            session_id=self.id, name=f"{self.prefix}who", dynamic=pb.Dynamic(provider_key="v")
        )
        await self.stub.RegisterVariable(variable)

    async def asked(self, scope: str = "", fields: str = "") -> pb.ProvideRequest:
        """Assemble for that context, answer the ProvideRequest it sends, and return it."""
        context = pb.AssembleContext(scope=scope, fields_json=fields)
        assembling = self.stub.Assemble(pb.AssembleRequest(context=context), timeout=10)
        ask = await self.answer()
        await asyncio.wait_for(assembling, 10)
        return ask

    async def answer(self) -> pb.ProvideRequest:
        """Answer the next ProvideRequest on the stream, and return it."""
        ask: pb.ProvideRequest = (await self.stream.read()).provide
        values = [
            pb.ProvidedValue(provider_key="s", text="section text"),
            pb.ProvidedValue(provider_key="v", variable_value="someone"),
        ]
        answer = pb.ProvideResponse(call_id=ask.call_id, values=values)
        await self.stream.write(pb.OpenSessionRequest(provided=answer))
        return ask


@pytest.fixture
async def session(sidecar: Sidecar) -> AsyncIterator[RawSession]:
    async with raw_channel(sidecar.address) as channel:
        held = RawSession(channel)
        await held.open()
        yield held
        held.stream.cancel()


def calls_of(ask: pb.ProvideRequest) -> set[tuple[str, int]]:
    return {(call.provider_key, call.kind) for call in ask.calls}


async def test_a_provide_request_carries_its_id_context_calls_and_timeout(
    sidecar: Sidecar, session: RawSession
) -> None:
    fields = json.dumps({"turn": 7})
    ask = await session.asked("worker", fields)
    expected = pb.ProvideRequest(
        call_id=ask.call_id,
        context=pb.AssembleContext(scope="worker", fields_json=fields),
        calls=list(ask.calls),
        timeout_s=sidecar.config.registry.provider_timeout_s,
    )
    assert ask.call_id >= 1 and ask == expected
    assert calls_of(ask) == {("s", pb.PROVIDER_KIND_SECTION), ("v", pb.PROVIDER_KIND_VARIABLE)}
    assert dict(ask.trace_context) == {}


async def test_the_same_context_again_reuses_the_kept_encoding_under_a_new_id(
    sidecar: Sidecar, session: RawSession
) -> None:
    first = await session.asked(fields='{"turn": 1}')
    second = await session.asked(fields='{"turn": 1}')
    kept = sidecar.state.sessions.get(session.id).requests
    assert len(kept) == 1
    assert second.call_id == first.call_id + 1
    second.call_id = first.call_id
    assert second == first
    other = await session.asked(fields='{"turn": 2}')
    assert other.context.fields_json == '{"turn": 2}' and len(kept) == 2


async def test_every_session_joins_from_the_same_kept_encodings(sidecar: Sidecar) -> None:
    async with raw_channel(sidecar.address) as channel:
        one, two = RawSession(channel, "one_"), RawSession(channel, "two_")
        await one.open()
        await two.open()
        context = pb.AssembleContext(fields_json='{"turn": 1}')
        assembling = one.stub.Assemble(pb.AssembleRequest(context=context), timeout=10)
        asks = [await one.answer(), await two.answer()]  # the same calls and context each
        await asyncio.wait_for(assembling, 10)
        kept = sidecar.state.sessions.get(one.id).requests
        assert sidecar.state.sessions.get(two.id).requests is kept
        assert len(kept) == 1 and calls_of(asks[0]) == calls_of(asks[1])
        one.stream.cancel()
        two.stream.cancel()


def test_kept_encodings_stay_within_their_bytes() -> None:
    requests = ProvideRequests(max_bytes=64 * 1024)
    calls = [ProviderCall(key="k", kind=Kind.SECTION, name="dyn", scope=None)]
    for index in range(100):  # 100 contexts of 4 KiB of fields: 400 KiB if all were kept
        context = AssembleContext(fields_json=json.dumps({"n": index, "pad": "x" * 4096}))
        encoded = requests.encode(index + 1, calls, context, 5.0, {})
        message = pb.OpenSessionResponse.FromString(encoded).provide
        assert (message.call_id, message.context.fields_json) == (index + 1, context.fields_json)
    assert 0 < len(requests) < 100 and requests.bytes <= 64 * 1024


def test_a_context_larger_than_the_budget_is_encoded_each_time_never_kept() -> None:
    requests = ProvideRequests(max_bytes=1024)
    calls = [ProviderCall(key="k", kind=Kind.TOOLS, name="", scope="a")]
    context = AssembleContext(scope="a", fields_json=json.dumps({"pad": "x" * 2048}))
    traced = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    message = pb.OpenSessionResponse.FromString(requests.encode(3, calls, context, None, traced))
    assert message.provide.context.fields_json == context.fields_json
    assert dict(message.provide.trace_context) == traced and message.provide.timeout_s == 0.0
    assert [(c.provider_key, c.kind) for c in message.provide.calls] == [
        ("k", pb.PROVIDER_KIND_TOOLS)
    ]
    assert len(requests) == 0 and requests.bytes == 0
