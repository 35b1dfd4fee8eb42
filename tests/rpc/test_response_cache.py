"""A repeated Assemble request is answered from its own bytes before it is parsed (issue 24,
item 6), and no change leaves a stale answer behind: a registration, a scope re-parented,
a provider's invalidation, a config reload; nor does a kept answer pass the policy by,
whatever credential asks, and after credentials are reloaded.

Requests go over a raw channel as bytes, so that the same bytes come again.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar, load_config
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import ClientFactory, SidecarFactory, metric, raw_channel

ASSEMBLE = "/dsh.systemprompt.v1.SystemPromptService/Assemble"


def request(scope: str = "", fields: dict[str, str] | None = None) -> bytes:
    context = pb.AssembleContext(scope=scope, fields_json=json.dumps(fields) if fields else "")
    return pb.AssembleRequest(context=context, render=True).SerializeToString()


class Raw:
    """Assemble over one channel, bytes in and bytes out, with an optional token."""

    def __init__(self, channel: grpc.aio.Channel, token: str | None = None) -> None:
        self._call = channel.unary_unary(ASSEMBLE)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None

    async def answer(self, encoded: bytes) -> bytes:
        answered: bytes = await self._call(encoded, metadata=self._metadata, timeout=5)
        return answered

    async def sections(self, encoded: bytes) -> dict[str, str]:
        reply = pb.AssembleResponse.FromString(await self.answer(encoded))
        return {section.name: section.text for section in reply.assembly.sections}

    async def refusal(self, encoded: bytes) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await self.answer(encoded)
        return refused.value


@pytest.fixture
async def raw(sidecar: Sidecar) -> AsyncIterator[Raw]:
    async with raw_channel(sidecar.address) as channel:
        yield Raw(channel)


class Counted:
    """A provider that says how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    def __call__(self, context: dsp.AssembleContext) -> str:
        self.asked += 1
        return f"asked {self.asked}"


def served(sidecar: Sidecar) -> float:
    return metric(sidecar, "dsp_assemble_seconds_count")


# -- answered from the request's bytes -----------------------------------------------


async def answered_once(client: dsp.Client, raw: Raw) -> tuple[bytes, bytes]:
    """A static plan's request, and its answer, given once."""
    await client.section("rules", 10, "be brief")
    encoded = request()
    return encoded, await raw.answer(encoded)


async def test_a_repeated_request_is_answered_from_its_bytes(
    sidecar: Sidecar, client: dsp.Client, raw: Raw
) -> None:
    encoded, first = await answered_once(client, raw)
    assert sidecar.state.assembler.kept(encoded) == first
    assert await raw.answer(encoded) == first


async def test_a_kept_answer_is_counted_as_an_assemble(
    sidecar: Sidecar, client: dsp.Client, raw: Raw
) -> None:
    encoded, _ = await answered_once(client, raw)
    before = served(sidecar)
    assert sidecar.state.assembler.kept(encoded) is not None
    await raw.answer(encoded)
    assert served(sidecar) == before + 1


async def test_a_dynamic_plan_is_never_answered_from_bytes(
    sidecar: Sidecar, client: dsp.Client, raw: Raw
) -> None:
    await client.section("clock", 10, Counted())
    encoded = request()
    assert (await raw.sections(encoded))["clock"] == "asked 1"
    assert (await raw.sections(encoded))["clock"] == "asked 2"
    assert sidecar.state.assembler.kept(encoded) is None


async def test_other_fields_on_a_static_plan_get_the_same_answer(
    client: dsp.Client, raw: Raw
) -> None:
    await client.section("rules", 10, "be brief")
    one = await raw.answer(request(fields={"who": "a"}))
    assert await raw.answer(request(fields={"who": "b"})) == one


async def test_a_kept_answer_is_refused_once_draining(
    sidecar: Sidecar, client: dsp.Client, raw: Raw
) -> None:
    encoded, _ = await answered_once(client, raw)
    sidecar.state.gate.close()
    refused = await raw.refusal(encoded)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE


async def test_once_draining_a_request_too_large_is_refused_as_every_call_is(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(limits={"max_fields_bytes": 1024})
    async with raw_channel(sidecar.address) as channel:
        caller = Raw(channel)
        too_large = await caller.refusal(request(fields={"note": "x" * 2000}))
        sidecar.state.gate.close()
        draining = await caller.refusal(request(fields={"note": "x" * 2000}))
    assert too_large.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert draining.code() == grpc.StatusCode.UNAVAILABLE  # the gate first, as for every RPC


async def test_bytes_that_are_no_request_are_refused_and_the_sidecar_serves_on(
    client: dsp.Client, raw: Raw
) -> None:
    await client.section("rules", 10, "be brief")
    refused = await raw.refusal(b"\xff\xff\xff")
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "the request's bytes are not an AssembleRequest message"
    assert (await raw.sections(request()))["rules"] == "be brief"


async def test_requests_indexed_stay_within_max_response_cache_bytes(
    make_sidecar: SidecarFactory,
) -> None:
    budget = 256 * 1024
    sidecar = await make_sidecar(limits={"max_response_cache_bytes": budget})
    async with dsp.connect(sidecar.address) as client, raw_channel(sidecar.address) as channel:
        await client.section("big", 1, "b" * 60_000)
        caller = Raw(channel)
        for index in range(600):  # 600 distinct requests, each 1 KiB of fields
            await caller.answer(request(fields={"n": f"{index:04d}" + "x" * 1000}))
        again = await caller.sections(request(fields={"n": "0000" + "x" * 1000}))
    assert sidecar.state.assembler.responses.bytes <= budget
    assert again["big"] == "b" * 60_000


# -- no stale answer survives ---------------------------------------------------------


async def test_a_registration_changes_the_answer_to_the_same_bytes(
    client: dsp.Client, raw: Raw
) -> None:
    rules = await client.section("rules", 10, "be brief")
    encoded = request()
    assert (await raw.sections(encoded))["rules"] == "be brief"
    await rules.update("be thorough")
    assert (await raw.sections(encoded))["rules"] == "be thorough"
    await client.section("more", 20, "and kind")
    assert (await raw.sections(encoded))["more"] == "and kind"
    await rules()
    assert "rules" not in await raw.sections(encoded)


async def test_a_scope_bound_to_a_parent_changes_the_answer(client: dsp.Client, raw: Raw) -> None:
    team = await client.scope("team")
    await team.section("team", 10, "t")
    worker = await client.scope("worker")
    await worker.section("worker", 20, "w")
    encoded = request("worker")
    assert "team" not in await raw.sections(encoded)
    await client.scope("worker", parent="team")
    assert (await raw.sections(encoded))["team"] == "t"


async def test_a_scope_re_parented_changes_the_answer(connect: ClientFactory, raw: Raw) -> None:
    owner = await connect()
    for key in ("team-a", "team-b"):
        await (await owner.scope(key)).section(key, 10, key)
    worker = await connect()
    await worker.scope("worker", parent="team-a")
    encoded = request("worker")
    assert "team-a" in await raw.sections(encoded)
    await worker.close()  # its handle was the only one: the key and its parent are forgotten
    again = await connect()
    await again.scope("worker", parent="team-b")
    answer = await raw.sections(encoded)
    assert "team-b" in answer and "team-a" not in answer


async def test_an_unknown_scope_opened_later_changes_the_answer(
    client: dsp.Client, raw: Raw
) -> None:
    encoded = request("later")
    assert "later" not in await raw.sections(encoded)  # no layer: the global plan
    await (await client.scope("later")).section("later", 10, "its own")
    assert (await raw.sections(encoded))["later"] == "its own"


async def test_an_invalidated_provider_is_asked_again_for_the_same_bytes(
    sidecar: Sidecar, client: dsp.Client, raw: Raw
) -> None:
    handle = await client.section("dynamic", 1, Counted(), cache=dsp.Cache.REVISION)
    encoded = request()
    assert (await raw.sections(encoded))["dynamic"] == "asked 1"
    assert (await raw.sections(encoded))["dynamic"] == "asked 1"
    assert sidecar.state.assembler.kept(encoded) is not None
    await handle.invalidate()
    assert (await raw.sections(encoded))["dynamic"] == "asked 2"


def reloaded(sidecar: Sidecar, config: Path, text: str) -> list[str]:
    config.write_text(text)
    done = Reloader(sidecar, str(config), lambda: load_config(config)).reload("test")
    assert done is not None
    return done.applied


async def test_a_reload_of_render_settings_changes_the_answer(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text('persona = "Before."\n')
    sidecar = await make_sidecar(**tomllib.loads(config.read_text()))
    async with raw_channel(sidecar.address) as channel:
        caller, encoded = Raw(channel), request()
        assert (await caller.sections(encoded))[dsp.PERSONA_SECTION] == "Before."
        reloaded(sidecar, config, 'persona = "After."\n')
        assert (await caller.sections(encoded))[dsp.PERSONA_SECTION] == "After."
        reloaded(sidecar, config, 'persona = "After."\ninclude_harness_identity = false\n')
        assert "harness:identity" not in await caller.sections(encoded)


async def test_a_reload_of_limits_refuses_the_same_bytes(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text("")
    sidecar = await make_sidecar()
    async with raw_channel(sidecar.address) as channel:
        caller, encoded = Raw(channel), request(fields={"note": "x" * 2000})
        await caller.answer(encoded)
        assert sidecar.state.assembler.kept(encoded) is not None
        reloaded(sidecar, config, "[limits]\nmax_fields_bytes = 1024\n")
        refused = await caller.refusal(encoded)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fields_json" in (refused.details() or "")


async def test_requests_varying_only_in_what_a_static_plan_ignores_push_no_answer_out(
    sidecar: Sidecar, client: dsp.Client, raw: Raw
) -> None:
    await (await client.scope("other")).section("theirs", 5, "kept")
    await raw.answer(request("other"))
    for n in range(2100):  # past the cache's 2,048 entries, each request new bytes
        await raw.answer(request(fields={"n": str(n)}))
    assert sidecar.state.assembler.kept(request("other")) is not None


# -- the policy decides every call ----------------------------------------------------

ADMIN, PLANNER = "admin-token-0123", "planner-token-4567"


def auth_config(folder: Path, planner_scopes: str) -> str:
    (folder / "admin.token").write_text(ADMIN)
    (folder / "planner.token").write_text(PLANNER)
    return (
        f'auth_token_file = "{folder / "admin.token"}"\n'
        f'[[credentials]]\nname = "planner"\nrole = "agent"\n'
        f'token_file = "{folder / "planner.token"}"\nscopes = {planner_scopes}\n'
    )


@pytest.fixture
async def guarded(make_sidecar: SidecarFactory, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """A sidecar with an admin and an agent that may read scope "planner" only; scope
    "worker" holds a section."""
    config = tmp_path / "sidecar.toml"
    config.write_text(auth_config(tmp_path, '["planner"]'))
    sidecar = await make_sidecar(**tomllib.loads(config.read_text()))
    async with dsp.connect(sidecar.address, token=ADMIN) as admin:
        await (await admin.scope("worker")).section("worker-notes", 5, "private")
        async with raw_channel(sidecar.address) as channel:  # kept for the admin's bytes
            caller = Raw(channel, ADMIN)
            assert (await caller.sections(request("worker")))["worker-notes"] == "private"
            assert sidecar.state.assembler.kept(request("worker")) is not None
        yield sidecar


async def test_a_kept_answer_is_refused_to_a_credential_the_policy_denies(
    guarded: Sidecar,
) -> None:
    async with raw_channel(guarded.address) as channel:
        refused = await Raw(channel, PLANNER).refusal(request("worker"))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert 'scope "worker" is not in its scopes (planner)' in (refused.details() or "")


async def test_a_kept_answer_is_refused_to_a_caller_without_a_credential(
    guarded: Sidecar,
) -> None:
    async with raw_channel(guarded.address) as channel:
        refused = await Raw(channel).refusal(request("worker"))
        wrong = await Raw(channel, "not-a-token").refusal(request("worker"))
    assert refused.code() == wrong.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_reloaded_credentials_decide_the_same_bytes_again(
    guarded: Sidecar, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    encoded = request("worker")
    async with raw_channel(guarded.address) as channel:
        planner = Raw(channel, PLANNER)
        await planner.refusal(encoded)
        assert reloaded(guarded, config, auth_config(tmp_path, '["*"]')) == ["credentials"]
        assert (await planner.sections(encoded))["worker-notes"] == "private"
        assert reloaded(guarded, config, auth_config(tmp_path, "[]")) == ["credentials"]
        refused = await planner.refusal(encoded)
    assert guarded.state.assembler.kept(encoded) is not None  # kept, and still refused
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("encoded", "reason"),
    [(b"\xff\xff\xff", "INVALID_VALUE"), (b"\xff" * 100_000, "VALUE_TOO_LARGE")],
    ids=["no-message", "too-large"],
)
async def test_a_bad_request_gets_its_own_status_with_a_credential_too(
    guarded: Sidecar, encoded: bytes, reason: str
) -> None:
    async with raw_channel(guarded.address) as channel:
        refused = await Raw(channel, ADMIN).refusal(encoded)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(refused.trailing_metadata() or ())["dsh-error-reason"] == reason
