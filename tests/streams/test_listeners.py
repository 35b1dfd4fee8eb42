"""Waterfall listeners: around-middleware over every admitted assembly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import (
    ClientFactory,
    SidecarFactory,
    listener_streams,
    section_names,
    tool,
    tool_names,
)

Next = Callable[..., Awaitable[dsp.PromptAssembly]]


def appending(name: str, log: list[str] | None = None) -> Callable[..., Awaitable[object]]:
    """A listener that appends section `name` before next() and logs its turn."""

    async def listener(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        if log is not None:
            log.append(name)
        assembly.sections.append(dsp.AssembledSection(name, name))
        return await next_()

    listener.__qualname__ = name
    return listener


async def test_listeners_run_in_registration_order_with_prepend_first(
    client: dsp.Client,
) -> None:
    log: list[str] = []
    await client.on_assemble(appending("first", log))
    await client.on_assemble(appending("second", log))
    await client.on_assemble(appending("early", log), prepend=True)
    await client.on_assemble(appending("earliest", log), prepend=True)
    assembly = await client.assemble()
    assert log == ["earliest", "early", "first", "second"]
    assert section_names(assembly)[-4:] == log


async def test_listener_short_circuits_without_next(client: dsp.Client) -> None:
    log: list[str] = []

    async def replace(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        return dsp.PromptAssembly(sections=[dsp.AssembledSection("only", "mine")])

    await client.on_assemble(replace)
    await client.on_assemble(appending("never", log))
    assembly = await client.assemble()
    assert log == []
    assert assembly == dsp.PromptAssembly(sections=[dsp.AssembledSection("only", "mine")])


async def test_listener_post_processes_what_next_returned(client: dsp.Client) -> None:
    async def shout(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        result = await next_()
        result.sections = [dsp.AssembledSection(s.name, s.text.upper()) for s in result.sections]
        return result

    await client.on_assemble(shout)
    await client.on_assemble(appending("later"))
    assembly = await client.assemble()
    assert assembly.sections[-1] == dsp.AssembledSection("later", "LATER")


async def test_listener_adds_a_variable_used_in_rendering(client: dsp.Client) -> None:
    async def add_date(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.variables["date"] = ctx.get("date")
        return await next_()

    await client.section("today", 1, "Today is {{date}}.")
    await client.on_assemble(add_date)
    rendered = await client.render(fields={"date": "2026-11-29"})
    assert rendered.prompt.endswith("Today is 2026-11-29.")
    assert rendered.assembly.variables == {"date": "2026-11-29"}


async def test_scoped_listener_sees_its_scope_and_descendants_only(client: dsp.Client) -> None:
    log: list[str] = []
    parent = await client.scope("parent")
    await client.scope("child", parent="parent")
    await client.scope("sibling")
    await parent.on_assemble(appending("on-parent", log))
    await client.on_assemble(appending("unscoped", log))
    for scope in ("parent", "child", "sibling", None):
        await client.assemble(scope=scope)
    assert log == ["on-parent", "unscoped", "on-parent", "unscoped", "unscoped", "unscoped"]


async def test_scoped_listener_does_not_see_an_ancestors_assembly(client: dsp.Client) -> None:
    log: list[str] = []
    await client.scope("parent")
    child = await client.scope("child", parent="parent")
    await child.on_assemble(appending("on-child", log))
    await client.assemble(scope="parent")
    await client.assemble(scope="child")
    assert log == ["on-child"]


async def test_global_scoped_listener_sees_every_assembly(client: dsp.Client) -> None:
    log: list[str] = []
    scope = await client.scope("agent-1")
    await scope.on_assemble(appending("global", log), global_=True)
    await client.assemble(scope="agent-2")
    await client.assemble()
    assert log == ["global", "global"]


async def test_raising_listener_fails_the_assembly_naming_it(client: dsp.Client) -> None:
    async def policy(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        raise ValueError("forbidden tool")

    await client.on_assemble(policy)
    with pytest.raises(dsp.SystemPromptError) as failure:
        await client.assemble()
    assert failure.value.code == grpc.StatusCode.ABORTED
    assert failure.value.reason == "LISTENER_FAILED"
    assert 'listener "test_raising_listener_fails_the_assembly_naming_it.<locals>.policy"' in str(
        failure.value
    )
    assert "forbidden tool" in str(failure.value)


async def test_listener_returning_duplicate_section_names_is_rejected(client: dsp.Client) -> None:
    async def duplicate(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections.append(dsp.AssembledSection("dup", "a"))
        assembly.sections.append(dsp.AssembledSection("dup", "b"))
        return await next_()

    await client.on_assemble(duplicate)
    with pytest.raises(dsp.SystemPromptError) as failure:
        await client.assemble()
    assert failure.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert failure.value.reason == "INVARIANT_VIOLATION"
    assert failure.value.message == 'assembled section name "dup" is duplicated'


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda a: a.sections.append(dsp.AssembledSection("", "x")),
            "assembled section names must be non-empty",
        ),
        (
            lambda a: a.contexts.extend([dsp.AssembledContext("c", "1")] * 2),
            'assembled context name "c" is duplicated',
        ),
        (
            lambda a: a.contexts.append(dsp.AssembledContext("", "x")),
            "assembled context names must be non-empty",
        ),
        (
            lambda a: a.tools.append(dsp.ToolSchema("", "nameless", {})),
            "assembled tool names must be non-empty",
        ),
        (
            lambda a: a.variables.update({"Not Valid": "x"}),
            'assembled variable name "Not Valid" is invalid',
        ),
    ],
)
async def test_invariant_violations_from_listeners_are_rejected(
    client: dsp.Client, mutate: Callable[[dsp.PromptAssembly], object], message: str
) -> None:
    async def breaks(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        mutate(assembly)
        return await next_()

    await client.on_assemble(breaks)
    with pytest.raises(dsp.SystemPromptError) as failure:
        await client.assemble()
    assert failure.value.reason == "INVARIANT_VIOLATION"
    assert failure.value.message == message


async def test_complete_section_is_restored_against_a_meddling_listener(
    client: dsp.Client,
) -> None:
    async def meddle(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections = [dsp.AssembledSection("other", "listener text")]
        assembly.tools.append(tool("added"))
        return await next_()

    await client.section(
        "exact", 5, lambda ctx: f"Exact prompt for {ctx.get('who')}.", complete=True
    )
    await client.on_assemble(meddle)
    assembly = await client.assemble(fields={"who": "alice"})
    assert assembly.sections == [dsp.AssembledSection("exact", "Exact prompt for alice.")]
    assert tool_names(assembly) == ["added"]


async def test_suppressed_assembly_drops_contexts_listeners_added(client: dsp.Client) -> None:
    async def add_context(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.contexts.append(dsp.AssembledContext("added", "by listener"))
        return await next_()

    scope = await client.scope("quiet")
    await scope.suppress_runtime_context()
    await client.on_assemble(add_context)
    assert (await client.assemble(scope="quiet")).contexts == []
    assert (await client.assemble()).contexts == [dsp.AssembledContext("added", "by listener")]


async def test_tool_order_is_canonical_before_listeners_and_their_additions_stay_put(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(tool_order=["bash", dsp.TOOL_ORDER_REST])
    seen: list[list[str]] = []

    async def add_tool(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        seen.append(tool_names(assembly))
        assembly.tools.append(tool("aaa"))
        return await next_()

    async with dsp.connect(sidecar.address) as client:
        await client.tools([tool("zed"), tool("bash"), tool("grep")])
        await client.on_assemble(add_tool)
        assembly = await client.assemble()
    assert seen == [["bash", "grep", "zed"]]
    assert tool_names(assembly) == ["bash", "grep", "zed", "aaa"]


async def test_mutations_never_leak_between_assemblies(client: dsp.Client) -> None:
    async def mutate(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections[0] = dsp.AssembledSection("harness:identity", "changed")
        assembly.tools[0].parameters["injected"] = True
        assembly.variables["model"] = "changed"
        return await next_()

    await client.tools([dsp.ToolSchema("t", "d", {"type": "object"})])
    await client.variable("model", "original")
    off = await client.on_assemble(mutate)
    returned = await client.assemble()
    returned.sections.clear()
    await off()
    fresh = await client.assemble()
    assert fresh.sections[0].text == "You are an AI agent powered by DeepSeek Harness."
    assert fresh.tools == [dsp.ToolSchema("t", "d", {"type": "object"})]
    assert fresh.variables == {"model": "original"}


async def test_listener_time_inside_next_does_not_count_against_its_timeout(
    make_sidecar: SidecarFactory,
) -> None:
    bound = 0.5
    sidecar = await make_sidecar(provider_timeout_s=bound)
    loop = asyncio.get_running_loop()
    inside: list[float] = []  # when the outer listener entered next(), and when it left

    async def outer(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections.append(dsp.AssembledSection("outer", "outer"))
        inside.append(loop.time())
        result = await next_()
        inside.append(loop.time())
        return result

    def answers_at(share: float) -> Callable[..., Awaitable[object]]:
        async def inner(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
            # A deadline, not a fixed delay: late turns shorten the wait, never lengthen it.
            await asyncio.sleep(inside[0] + share * bound - loop.time())
            return await next_()

        return inner

    async with dsp.connect(sidecar.address) as client:
        await client.on_assemble(outer)
        for share in (0.4, 0.8, 1.2):  # each within the bound, together beyond it
            await client.on_assemble(answers_at(share))
        assembly = await client.assemble(timeout=5)
    assert inside[1] - inside[0] > bound
    assert section_names(assembly)[-1] == "outer"


async def test_hung_listener_fails_the_assembly_with_a_timeout_naming_it(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.3)

    async def hangs(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        await asyncio.Event().wait()
        return assembly

    async with dsp.connect(sidecar.address) as client:
        off = await client.on_assemble(hangs)
        with pytest.raises(dsp.SystemPromptError) as failure:
            await client.assemble(timeout=5)
        assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert failure.value.reason == "LISTENER_TIMEOUT"
        assert "hangs" in str(failure.value)
        await off()
        await client.assemble(timeout=5)


async def test_tail_call_listener_costs_one_round_trip(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async def tail(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.sections.append(dsp.AssembledSection("tail", "added"))
        return next_()

    async def awaits(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        return await next_()

    await client.on_assemble(tail)
    [stream] = listener_streams(sidecar)
    assembly = await client.assemble()
    assert section_names(assembly)[-1] == "tail"
    assert stream.messages_sent == 1  # the invocation only
    await client.on_assemble(awaits)
    await client.assemble()
    streams = listener_streams(sidecar)
    # The tail listener: one invocation per assembly; the awaiting one: invocation + result.
    assert [s.messages_sent for s in streams] == [2, 2]


async def test_disposed_listener_is_not_invoked_again(sidecar: Sidecar, client: dsp.Client) -> None:
    log: list[str] = []
    off = await client.on_assemble(appending("gone", log))
    await client.assemble()
    await off()
    await off()
    assembly = await client.assemble()
    assert log == ["gone"]
    assert "gone" not in section_names(assembly)
    assert listener_streams(sidecar) == []


async def test_listener_may_register_and_assemble_while_invoked(client: dsp.Client) -> None:
    other = await client.scope("other")
    await other.section("other", 1, "other text")
    registered: list[dsp.Disposer] = []

    async def reentrant(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        if ctx.scope == "other":
            return await next_()
        inner = await client.assemble(scope="other", timeout=5)
        if not registered:
            registered.append(await client.section("late", 99, "registered by listener"))
        assembly.sections.append(dsp.AssembledSection("copied", inner.sections[-1].text))
        return await next_()

    await client.on_assemble(reentrant)
    first = await client.assemble(timeout=5)
    second = await client.assemble(timeout=5)
    assert section_names(first)[-1] == "copied"
    assert "late" not in section_names(first)
    assert "late" in section_names(second)


async def test_listener_of_a_closed_session_is_removed(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    owner, caller = await connect(), await connect()
    await owner.on_assemble(appending("owned"))
    assert section_names(await caller.assemble())[-1] == "owned"
    await owner.close()
    assert "owned" not in section_names(await caller.assemble())
    assert listener_streams(sidecar) == []


async def test_a_tool_changed_in_place_reaches_the_rest_of_the_chain(client: dsp.Client) -> None:
    seen: list[str] = []

    async def rename(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        assembly.tools[0].description = "changed in place"
        return await next_()

    async def look(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        seen.extend(tool.description for tool in assembly.tools)
        return next_()

    await client.tools([tool("alpha"), tool("beta")])
    await client.on_assemble(rename)
    await client.on_assemble(look)
    assembly = await client.assemble()
    assert seen == ["changed in place", "the beta tool"]
    assert [t.description for t in assembly.tools] == ["changed in place", "the beta tool"]


async def test_tools_handed_back_reordered_keep_their_exact_schemas(client: dsp.Client) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}

    async def shuffle(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        result = await next_()
        result.tools = [*reversed(result.tools), dsp.ToolSchema("added", "late", {"b": 2, "a": 1})]
        return result

    await client.tools([dsp.ToolSchema("one", "1", schema), dsp.ToolSchema("two", "2", schema)])
    await client.on_assemble(shuffle)
    assembly = await client.assemble()
    assert tool_names(assembly) == ["two", "one", "added"]
    assert assembly.tools[0].parameters == schema
    assert list(assembly.tools[2].parameters) == ["b", "a"]  # key order kept


async def test_the_documented_maximum_of_listeners_all_calling_next_assemble(
    connect: ClientFactory,
) -> None:
    async def passing(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next):
        return await next_()

    # 1,000, the default maximum, from ten clients: 100 each is one client's limit
    # (limits.max_listeners_per_peer; each client is a loopback connection of its own).
    clients = [await connect() for _ in range(10)]
    for client in clients:
        for _ in range(100 if client is not clients[-1] else 99):
            await client.on_assemble(passing)
    await client.on_assemble(appending("last"))  # the 1,000th leaves its mark
    assembly = await client.assemble(timeout=20)
    assert section_names(assembly)[-1] == "last"
