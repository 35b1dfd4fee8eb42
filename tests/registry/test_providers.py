"""Dynamic providers: values that stay in the client and are asked for at each assembly."""

from __future__ import annotations

import asyncio

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientFactory, ClientOf, SidecarFactory, section_names, tool, tool_names


def provide_requests(sidecar: Sidecar, client: dsp.Client) -> int:
    return sidecar.state.sessions.get(client.session_id).provide_requests


async def test_assembly_context_reaches_every_kind_of_provider(client: dsp.Client) -> None:
    seen: list[tuple[str, str | None, object]] = []

    def remember(kind: str, ctx: dsp.AssembleContext) -> None:
        seen.append((kind, ctx.scope, ctx.get("who")))

    await client.section("s", 1, lambda ctx: remember("section", ctx) or "s")
    await client.context("c", 1, lambda ctx: remember("context", ctx) or "c")
    await client.variable("v", lambda ctx: remember("variable", ctx) or "v")
    await client.tools(lambda ctx: remember("tools", ctx) or [])
    await client.assemble(scope="agent-1", fields={"who": "alice"})
    assert sorted(seen) == [
        (kind, "agent-1", "alice") for kind in ("context", "section", "tools", "variable")
    ]


async def test_sync_and_async_providers_both_give_text(client: dsp.Client) -> None:
    async def later(ctx: dsp.AssembleContext) -> str:
        await asyncio.sleep(0)
        return f"async {ctx.get('n')}"

    await client.section("sync", 1, lambda ctx: f"sync {ctx.get('n')}")
    await client.section("async", 2, later)
    assembly = await client.assemble(fields={"n": 7})
    assert [s.text for s in assembly.sections[2:]] == ["sync 7", "async 7"]


async def test_one_request_per_session_per_assembly(sidecar: Sidecar, client: dsp.Client) -> None:
    for index in range(10):
        await client.section(f"s{index}", index, lambda ctx, i=index: f"text {i}")
    await client.context("c", 1, lambda ctx: "context")
    await client.variable("v", lambda ctx: "value")
    await client.tools(lambda ctx: [tool("t")])
    before = provide_requests(sidecar, client)
    await client.assemble()
    await client.assemble()
    assert provide_requests(sidecar, client) - before == 2


async def test_a_session_without_needed_providers_is_not_asked(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    asked, idle = await connect(), await connect()
    await asked.section("dyn", 1, lambda ctx: "x")
    await idle.section("static", 2, "y")
    await asked.assemble()
    assert provide_requests(sidecar, idle) == 0


async def test_different_sessions_are_asked_concurrently(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=3.0)
    both_asked = asyncio.Barrier(2)

    async def meet(ctx: dsp.AssembleContext) -> str:
        await both_asked.wait()  # only passes when both sessions were asked at once
        return "met"

    async with dsp.connect(sidecar.address) as one, dsp.connect(sidecar.address) as two:
        await one.section("one", 1, meet)
        await two.section("two", 2, meet)
        assembly = await one.assemble(timeout=5)
    assert [s.text for s in assembly.sections[2:]] == ["met", "met"]


async def test_shadowed_providers_are_never_called(client: dsp.Client) -> None:
    called: list[str] = []
    await client.section("rules", 1, lambda ctx: called.append("section") or "global")
    await client.variable("model", lambda ctx: called.append("variable") or "global")
    await client.context("cwd", 1, lambda ctx: called.append("context") or "global")
    scope = await client.scope("agent-1")
    await scope.section("rules", 1, "scoped")
    await scope.variable("model", "scoped")
    await scope.context("cwd", 1, "scoped")
    assembly = await client.assemble(scope="agent-1")
    assert called == []
    assert assembly.variables == {"model": "scoped"}


async def test_suppressed_context_providers_are_never_called(client: dsp.Client) -> None:
    called: list[str] = []
    await client.context("cwd", 1, lambda ctx: called.append("context") or "cwd")
    await client.suppress_runtime_context()
    assembly = await client.assemble()
    assert called == []
    assert assembly.contexts == []


async def test_variable_provider_answering_none_is_recorded_as_no_value(
    client: dsp.Client,
) -> None:
    await client.variable("who", lambda ctx: ctx.get("who"))
    await client.section("greeting", 1, "Hello {{who}}")
    assembly = await client.assemble()
    assert assembly.variables == {"who": None}
    with pytest.raises(dsp.RenderError, match=r'prompt variable "\{\{who\}\}" has no value'):
        dsp.render_prompt(assembly)
    rendered = await client.render(fields={"who": "alice"})
    assert rendered.prompt.endswith("Hello alice")


async def test_dynamic_tools_with_known_names_feed_the_tool_order(
    client_of: ClientOf,
) -> None:
    async with client_of(tool_order=["bash", dsp.TOOL_ORDER_REST, "grep"]) as client:
        await client.tools(
            lambda ctx: dsp.ToolProviderResult(
                schemas=[tool("read"), tool("grep")], known_names=["bash", "grep", "read"]
            )
        )
        assembly = await client.assemble()
    assert tool_names(assembly) == ["read", "grep"]


async def test_raising_provider_fails_the_assembly_naming_it(client: dsp.Client) -> None:
    def broken(ctx: dsp.AssembleContext) -> str:
        raise RuntimeError("disk on fire")

    await client.section("cwd", 1, broken)
    with pytest.raises(dsp.SystemPromptError) as failure:
        await client.assemble()
    assert failure.value.code == grpc.StatusCode.ABORTED
    assert failure.value.reason == "PROVIDER_FAILED"
    assert 'section provider "cwd" (global) failed' in str(failure.value)
    assert "disk on fire" in str(failure.value)


async def test_provider_of_the_wrong_type_fails_the_assembly(client: dsp.Client) -> None:
    scope = await client.scope("agent-1")
    await scope.variable("count", lambda ctx: 3)
    with pytest.raises(dsp.SystemPromptError) as failure:
        await client.assemble(scope="agent-1")
    assert failure.value.reason == "PROVIDER_FAILED"
    assert 'variable provider "count" in scope "agent-1" failed' in str(failure.value)


async def test_hung_provider_fails_within_the_callers_deadline_and_the_next_works(
    client: dsp.Client,
) -> None:
    release = asyncio.Event()

    async def hung(ctx: dsp.AssembleContext) -> str:
        await release.wait()
        return "late"

    off = await client.section("slow", 1, hung)
    with pytest.raises(dsp.SystemPromptError) as failure:
        await client.assemble(timeout=1.0)
    assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 'section provider "slow" (global)' in str(failure.value)
    await off()
    assert "slow" not in section_names(await client.assemble(timeout=5))


async def test_provider_timeout_from_config_names_the_provider(
    client_of: ClientOf,
) -> None:
    async with client_of(provider_timeout_s=0.3) as client:
        scope = await client.scope("agent-1")
        await scope.variable("date", lambda ctx: asyncio.Event().wait())
        with pytest.raises(dsp.SystemPromptError) as failure:
            await client.assemble(scope="agent-1")
    assert failure.value.reason == "PROVIDER_TIMEOUT"
    assert 'variable provider "date" in scope "agent-1" did not answer within 0.3s' in str(
        failure.value
    )


async def test_cancelled_assembly_cancels_the_provider_call(client: dsp.Client) -> None:
    cancelled = asyncio.Event()

    async def waits(ctx: dsp.AssembleContext) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return ""

    await client.section("waits", 1, waits)
    with pytest.raises(dsp.SystemPromptError):
        await client.assemble(timeout=0.5)
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_provider_whose_session_ends_fails_the_assembly_unavailable(
    connect: ClientFactory,
) -> None:
    owner, caller = await connect(), await connect()
    asked = asyncio.Event()

    async def waits(ctx: dsp.AssembleContext) -> str:
        asked.set()
        await asyncio.Event().wait()
        return ""

    await owner.section("waits", 1, waits)
    assembling = asyncio.create_task(caller.assemble(timeout=10))
    await asyncio.wait_for(asked.wait(), 5)
    await owner.close()
    with pytest.raises(dsp.SystemPromptError) as failure:
        await assembling
    assert failure.value.code == grpc.StatusCode.UNAVAILABLE
    assert 'section provider "waits" (global)' in str(failure.value)


async def test_provider_registering_a_tool_mid_assembly_shows_next_time(
    client: dsp.Client,
) -> None:
    registered: list[dsp.Disposer] = []

    async def registers(ctx: dsp.AssembleContext) -> str:
        if not registered:
            registered.append(await client.tools([tool("late")]))
        return "text"

    await client.section("registers", 1, registers)
    first = await client.assemble(timeout=5)
    second = await client.assemble(timeout=5)
    assert tool_names(first) == []
    assert tool_names(second) == ["late"]


async def test_provider_may_assemble_another_scope_while_asked(client: dsp.Client) -> None:
    other = await client.scope("other")
    await other.section("other", 1, lambda ctx: "from other")

    async def nested(ctx: dsp.AssembleContext) -> str:
        inner = await client.assemble(scope="other", timeout=5)
        return inner.sections[-1].text

    scope = await client.scope("main")
    await scope.section("nested", 1, nested)
    assembly = await client.assemble(scope="main", timeout=5)
    assert assembly.sections[-1] == dsp.AssembledSection("nested", "from other")


async def test_disposed_provider_is_no_longer_asked(client: dsp.Client) -> None:
    calls: list[int] = []
    off = await client.section("counted", 1, lambda ctx: calls.append(1) or "x")
    await client.assemble()
    await off()
    assert "counted" not in section_names(await client.assemble())
    assert calls == [1]
