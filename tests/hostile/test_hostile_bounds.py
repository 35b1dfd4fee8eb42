"""Issue 22, findings 2 and 3: every request is bounded before any work, and every
cache the sidecar keeps for others is bounded in bytes."""

from __future__ import annotations

import json

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from helpers import ClientOf, SidecarFactory, raw_channel, raw_stub, traced_growth

MIB = 1024 * 1024


def _reason(error: grpc.aio.AioRpcError) -> str:
    return str(dict(error.trailing_metadata() or ()).get("dsh-error-reason", ""))


async def _refusal(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


# -- bounds per request (finding 3) ---------------------------------------------------


async def test_assemble_fields_over_max_fields_bytes_are_value_too_large_naming_the_field(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar()
    fields = json.dumps({"blob": "x" * (64 * 1024)})
    async with raw_channel(sidecar.address) as channel:
        request = pb.AssembleRequest(context=pb.AssembleContext(fields_json=fields))
        error = await _refusal(raw_stub(channel).Assemble(request, timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(error) == "VALUE_TOO_LARGE"
    assert "fields_json" in (error.details() or "")
    assert "limits.max_fields_bytes" in (error.details() or "")


async def test_assemble_fields_are_measured_before_they_are_parsed(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_fields_bytes": 1024})
    nested = '{"a":' * 2000 + "{}" + "}" * 2000  # far too deep, and over the bound
    async with raw_channel(sidecar.address) as channel:
        request = pb.AssembleRequest(context=pb.AssembleContext(fields_json=nested))
        error = await _refusal(raw_stub(channel).Assemble(request, timeout=10))
    assert _reason(error) == "VALUE_TOO_LARGE"


async def test_an_assemble_request_past_its_largest_legitimate_size_is_refused_unparsed(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_fields_bytes": 1024})
    garbage = b"\xff" * 100_000  # not a message at all: parsed, it would fail otherwise
    async with raw_channel(sidecar.address) as channel:
        call = channel.unary_unary(
            "/dsh.systemprompt.v1.SystemPromptService/Assemble",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        error = await _refusal(call(garbage, timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(error) == "VALUE_TOO_LARGE"
    assert "limits.max_fields_bytes" in (error.details() or "")


async def test_fields_within_the_bound_still_assemble(make_sidecar: SidecarFactory) -> None:
    sidecar = await make_sidecar()
    client = await dsp.connect(sidecar.address)
    try:
        await client.section("who", 1, lambda context: f"for {context.get('who')}")
        assembly = await client.assemble(fields={"who": "w" * 60_000})
    finally:
        await client.close()
    assert assembly.sections[-1].text == "for " + "w" * 60_000


_SEVENTEEN_KINDS = pb.ChangeFilter(kinds=[pb.CHANGE_KIND_SECTION] * 17)


@pytest.mark.parametrize(
    ("rpc", "message", "what"),
    [
        pytest.param(
            "WatchChanges",
            pb.WatchChangesRequest(filter=_SEVENTEEN_KINDS),
            "change filter kinds",
            id="watch-filter-kinds",
        ),
        pytest.param(
            "ListRegistrations",
            pb.ListRegistrationsRequest(filter=_SEVENTEEN_KINDS),
            "change filter kinds",
            id="listing-filter-kinds",
        ),
        pytest.param(
            "WatchChanges",
            pb.WatchChangesRequest(features=["x"] * 17),
            "watch features",
            id="watch-features",
        ),
    ],
)
async def test_a_stream_request_with_a_list_past_max_list_items_is_refused(
    make_sidecar: SidecarFactory, rpc: str, message: object, what: str
) -> None:
    sidecar = await make_sidecar(limits={"max_list_items": 16})
    async with raw_channel(sidecar.address) as channel:
        error = await _refusal(getattr(raw_stub(channel), rpc)(message).read())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _reason(error) == "VALUE_TOO_LARGE"
    assert f"{what} has 17 entries" in (error.details() or "")


async def test_tools_past_max_list_items_are_refused_in_one_registration(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_list_items": 16})
    client = await dsp.connect(sidecar.address)
    try:
        tools = [dsp.ToolSchema(f"t{i}", "d", {"type": "object"}) for i in range(17)]
        with pytest.raises(dsp.SystemPromptError) as caught:
            await client.tools(tools)
    finally:
        await client.close()
    assert caught.value.reason == "VALUE_TOO_LARGE"
    assert "tool schemas has 17 entries" in str(caught.value)


async def test_a_cache_invalidation_past_max_list_items_ends_its_session(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_list_items": 16})
    async with raw_channel(sidecar.address) as channel:
        session = raw_stub(channel).OpenSession()
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="t")))
        await session.read()
        invalidate = pb.CacheInvalidate(invalidate_id=1, provider_keys=["k"] * 17)
        await session.write(pb.OpenSessionRequest(invalidate=invalidate))
        error = await _refusal(session.read())
    assert _reason(error) == "VALUE_TOO_LARGE"
    assert len(sidecar.state.sessions) == 0


# -- caches bounded in bytes (finding 2) ----------------------------------------------


async def test_kept_responses_stay_within_max_response_cache_bytes(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_response_cache_bytes": MIB})
    client = await dsp.connect(sidecar.address)
    try:
        await client.section("big", 1, "b" * 200_000)
        for index in range(20):  # one static response per scope: 4 MB if all were kept
            await client.scope(f"s{index}")
            await client.assemble(scope=f"s{index}")
        again = await client.assemble(scope="s0")  # evicted: built again, still right
    finally:
        await client.close()
    assert sidecar.state.assembler.responses.bytes <= MIB
    assert len(sidecar.state.assembler.responses) >= 2
    assert again.sections[-1].text == "b" * 200_000


async def test_what_dynamic_plans_keep_between_assemblies_stays_within_the_cache_budget(
    client_of: ClientOf,
) -> None:
    async with client_of(limits={"max_response_cache_bytes": MIB}) as client:
        base = await client.scope("base")
        await base.section("big", 1, "b" * 200_000)
        await base.section("turn", 2, lambda context: f"turn {context.get('n')}")
        for index in range(24):
            await client.scope(f"s{index}", parent="base")
        await client.render(scope="s0", fields={"n": 0})

        async def render_each() -> None:  # a dynamic plan per scope: each kept its parts
            for index in range(24):
                await client.render(scope=f"s{index}", fields={"n": index})

        kept = await traced_growth(render_each)
        again = await client.render(scope="s0", fields={"n": 0})  # emptied: encoded again
    assert kept <= 3 * MIB  # the 1 MiB budget, and what the 24 plans are besides
    assert again.prompt.endswith("b" * 200_000 + "\n\nturn 0")


async def test_cached_callback_answers_stay_within_max_callback_cache_bytes(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_callback_cache_bytes": MIB})
    client = await dsp.connect(sidecar.address)
    asked: list[str] = []

    def provide(context: dsp.AssembleContext) -> str:
        asked.append(str(context.get("n")))
        return "a" * 100_000

    try:
        await client.section("dynamic", 1, provide, cache=dsp.Cache.FIELDS)
        for index in range(30):  # distinct fields: 30 answers, 3 MB, if all were kept
            await client.assemble(fields={"n": index, "pad": "p" * 50_000})
        await client.assemble(fields={"n": 29, "pad": "p" * 50_000})  # the latest is kept
    finally:
        await client.close()
    assert sidecar.registry.callbacks.bytes <= MIB
    assert asked.count("29") == 1


async def test_encodings_of_distinct_provider_answers_are_kept_within_a_byte_bound(
    client_of: ClientOf,
) -> None:
    answer = "a" * 250_000

    def provide(context: dsp.AssembleContext) -> str:
        return f"{context.get('n'):>6}{answer}"

    caches = {"max_callback_cache_bytes": MIB, "max_response_cache_bytes": MIB}
    async with client_of(limits=caches) as client:
        await client.section("dynamic", 1, provide, cache=dsp.Cache.FIELDS)
        await client.assemble(fields={"n": -1})

        async def distinct_answers() -> None:  # 50 MB of answers, 100 MB with encodings
            for index in range(200):
                await client.assemble(fields={"n": index})

        kept = await traced_growth(distinct_answers)
    assert kept < 48 * MIB  # the encodings' 32 MiB and the 1 MiB caches


async def test_report_history_counts_the_bytes_its_texts_take(
    make_sidecar: SidecarFactory,
) -> None:
    # 300,000 emoji: 1.2 MB in memory and in UTF-8, but 300,000 characters.
    sidecar = await make_sidecar(
        limits={"max_report_history_bytes": 4 * MIB, "max_text_bytes": 2 * MIB}
    )
    client = await dsp.connect(sidecar.address)
    try:
        await client.section("wide", 1, "\N{GRINNING FACE}" * 300_000)
        for index in range(5):
            await client.assemble(report=True, report_key=f"k{index}")
        first = await client.cache_history(report_key="k0")
    finally:
        await client.close()
    assert first.evicted
