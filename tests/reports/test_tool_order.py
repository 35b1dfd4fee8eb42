"""A tool order that keeps the prefix (`tool_order_mode = "stable"`): a reported assembly's
tools keep the order of the history key's last report, new ones appended, removed ones
leaving the others in place, `tool_order` placements still first; the report says what
sorting would have broken. Over a real sidecar, through the wire's own report."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import ConfigError, parse_config
from helpers import (
    SidecarFactory,
    failure,
    raw_channel,
    raw_stub,
    rejection,
    tool,
    tool_names,
)
from wire.test_errors import error_info, raw_failure

REST = dsp.TOOL_ORDER_REST
Assemble = Callable[..., Awaitable[pb.AssembleResponse]]


class Stable:
    """A client of a sidecar in stable mode, and reported assemblies over the raw wire."""

    def __init__(self, client: dsp.Client, assemble: Assemble) -> None:
        self.client = client
        self.assemble = assemble

    async def names(self, key: str = "conv-1") -> list[str]:
        """The tool names of a reported assembly for `key`."""
        return [t.name for t in (await self.assemble(key)).assembly.tools]

    async def report(self, key: str = "conv-1") -> pb.AssemblyReport:
        return (await self.assemble(key)).report

    async def frozen(self, key: str = "conv-1") -> tuple[grpc.StatusCode, str, str]:
        """How a reported assembly of `key` fails: code, reason, message."""
        error = await raw_failure(self.assemble(key))
        return error.code(), error_info(error).reason, error.details() or ""


@pytest.fixture
async def stable(make_sidecar: SidecarFactory) -> AsyncIterator[Callable[..., Awaitable[Stable]]]:
    """Open a sidecar with `tool_order_mode` "stable" (and the config given), a client
    session of it and a raw stub asking for reported assemblies."""
    closing: list[Callable[[], Awaitable[object]]] = []

    async def open_stable(mode: str = "stable", **config: object) -> Stable:
        sidecar = await make_sidecar(tool_order_mode=mode, **config)
        client = await dsp.connect(sidecar.address)
        closing.append(client.close)
        channel = raw_channel(sidecar.address)
        opened = await channel.__aenter__()
        closing.append(lambda: channel.__aexit__(None, None, None))
        stub = raw_stub(opened)

        async def assemble(key: str, freeze: int = 0, report: bool = True) -> pb.AssembleResponse:
            request = pb.AssembleRequest(report=report, report_key=key, tool_freeze=freeze)
            response: pb.AssembleResponse = await stub.Assemble(request)
            return response

        return Stable(client, assemble)

    yield open_stable
    for close in reversed(closing):
        await close()


async def test_a_new_tool_is_appended_where_sorting_would_put_it_mid_list(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash"), tool("read"), tool("write")])
    first = await agent.report()
    assert first.HasField("tool_order") and not first.tool_order.kept  # sorted so far
    await agent.client.tools([tool("mcp__fs__abc")])
    assert await agent.names() == ["bash", "read", "write", "mcp__fs__abc"]
    report = await agent.report()
    assert report.tool_order == pb.ToolOrderReport(
        kept=True, position=1, sorted_tool="mcp__fs__abc", kept_tool="read"
    )
    assert report.stability.reason == ""  # the second report of the same order holds
    # an assembly that is not reported is sorted as ever: the order lives in reports
    assert tool_names(await agent.client.assemble()) == ["bash", "mcp__fs__abc", "read", "write"]


async def test_the_prefix_breaks_only_at_the_end_when_a_tool_is_added(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash"), tool("read")])
    before = await agent.report()
    await agent.client.tools([tool("abc")])
    after = await agent.report()
    assert after.stability.first_changed == 'tool "abc"'
    assert after.stability.reason == 'tool "abc" added at the end'
    assert after.stability.stable_bytes == before.stability.prefix.bytes  # all of it kept


async def test_a_removed_tool_leaves_the_others_where_they_were(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash"), tool("write")])
    read = await agent.client.tools([tool("read")])
    await agent.names()
    await agent.client.tools([tool("abc")])
    assert await agent.names() == ["bash", "read", "write", "abc"]
    await read()
    assert await agent.names() == ["bash", "write", "abc"]
    await agent.client.tools([tool("read")])  # back again: new, so at the end
    assert await agent.names() == ["bash", "write", "abc", "read"]


async def test_a_reconnect_registering_the_tools_anew_keeps_their_order(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash"), tool("read")])
    mcp = await agent.client.tools([tool("mcp__fs__zip"), tool("mcp__fs__cat")])
    await agent.names()
    await agent.client.tools([tool("abc")])
    kept = await agent.names()
    assert kept == ["bash", "mcp__fs__cat", "mcp__fs__zip", "read", "abc"]
    await mcp()  # the MCP server reconnects, listing its tools in another order
    await agent.client.tools([tool("mcp__fs__zip"), tool("mcp__fs__cat")])
    assert await agent.names() == kept
    assert (await agent.report()).stability.reason == ""


async def test_each_history_key_keeps_its_own_order(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash"), tool("read")])
    await agent.names("conv-1")
    await agent.client.tools([tool("abc")])
    assert await agent.names("conv-1") == ["bash", "read", "abc"]
    assert await agent.names("conv-2") == ["abc", "bash", "read"]  # its first: sorted


async def test_tool_order_placements_still_win(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable(tool_order=["write", REST, "todo"])
    await agent.client.tools([tool("write"), tool("bash"), tool("read"), tool("todo")])
    assert await agent.names() == ["write", "bash", "read", "todo"]
    await agent.client.tools([tool("abc")])
    assert await agent.names() == ["write", "bash", "read", "abc", "todo"]


async def test_an_evicted_key_starts_over_from_the_sorted_order(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable(report_keys=1)
    await agent.client.tools([tool("bash"), tool("read")])
    await agent.names("conv-1")
    await agent.client.tools([tool("abc")])
    assert await agent.names("conv-1") == ["bash", "read", "abc"]
    await agent.names("conv-2")  # conv-1's history (and with it its order) goes
    assert await agent.names("conv-1") == ["abc", "bash", "read"]


async def test_the_default_mode_sorts_and_the_report_says_nothing_of_order(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar()
    client = await dsp.connect(sidecar.address)
    try:
        await client.tools([tool("bash"), tool("read")])
        async with raw_channel(sidecar.address) as channel:
            stub = raw_stub(channel)
            request = pb.AssembleRequest(report=True, report_key="conv-1")
            await stub.Assemble(request)
            await client.tools([tool("abc")])
            response = await stub.Assemble(request)
        assert [t.name for t in response.assembly.tools] == ["abc", "bash", "read"]
        assert not response.report.HasField("tool_order")
    finally:
        await client.close()


def test_the_mode_is_one_of_sorted_and_stable() -> None:
    assert parse_config({}).registry.tool_order_mode == "sorted"
    assert parse_config({"tool_order_mode": "stable"}).registry.tool_order_mode == "stable"
    with pytest.raises(ConfigError, match="config key 'tool_order_mode' must be one of"):
        parse_config({"tool_order_mode": "frozen"})


# -- the tool freeze --------------------------------------------------------------------

HOLD, RELEASE = pb.TOOL_FREEZE_HOLD, pb.TOOL_FREEZE_RELEASE
RELEASE_HINT = " (release them with tool_freeze RELEASE to change them)"


def frozen(change: str, since: int = 1) -> tuple[grpc.StatusCode, str, str]:
    message = f'the tools of key "conv-1" are frozen since its report {since}: {change}'
    return grpc.StatusCode.FAILED_PRECONDITION, "TOOLS_FROZEN", message + RELEASE_HINT


@pytest.mark.parametrize("mode", ["sorted", "stable"])
async def test_a_frozen_key_refuses_an_assembly_that_adds_a_tool_and_keeps_nothing(
    stable: Callable[..., Awaitable[Stable]], mode: str
) -> None:
    agent = await stable(mode)
    await agent.client.tools([tool("bash"), tool("read")])
    await agent.assemble("conv-1", HOLD)
    await agent.client.tools([tool("abc")])
    assert await agent.frozen() == frozen('tool "abc" would be added')
    assert (await agent.client.cache_history(report_key="conv-1")).reports == 1
    assert await agent.names("conv-2") == ["abc", "bash", "read"]  # other keys are free
    assert tool_names(await agent.client.assemble()) == ["abc", "bash", "read"]  # unreported


async def test_a_frozen_key_refuses_a_removed_or_changed_tool(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash")])
    read = await agent.client.tools([tool("read")])
    await agent.names()
    await agent.assemble("conv-1", HOLD)  # the second report freezes them
    await read()
    assert await agent.frozen() == frozen('tool "read" would be removed', since=2)
    read = await agent.client.tools([tool("read", "Read a file, now with line numbers.")])
    assert await agent.frozen() == frozen('tool "read" would change', since=2)
    await read()
    await agent.client.tools([tool("read")])  # as it was: the assembly goes through
    assert await agent.names() == ["bash", "read"]


async def test_a_reconnect_reordering_tools_passes_a_freeze_in_stable_order(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash")])
    mcp = await agent.client.tools([tool("mcp__fs__zip"), tool("mcp__fs__cat")])
    await agent.assemble("conv-1", HOLD)
    await mcp()
    await agent.client.tools([tool("mcp__fs__cat"), tool("mcp__fs__zip")])
    assert await agent.names() == ["bash", "mcp__fs__cat", "mcp__fs__zip"]


async def test_release_lets_the_tools_change_and_a_later_hold_freezes_them_anew(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    await agent.client.tools([tool("bash")])
    await agent.assemble("conv-1", HOLD)
    await agent.assemble("conv-1", HOLD)  # held already: still since report 1
    await agent.client.tools([tool("read")])
    assert await agent.frozen() == frozen('tool "read" would be added')
    released = await agent.assemble("conv-1", RELEASE)  # compaction
    assert [t.name for t in released.assembly.tools] == ["bash", "read"]
    await agent.client.tools([tool("abc")])
    assert await agent.names() == ["bash", "read", "abc"]  # not frozen any more
    await agent.assemble("conv-1", HOLD)  # report 5
    await agent.client.tools([tool("zed")])
    assert await agent.frozen() == frozen('tool "zed" would be added', since=5)


async def test_a_freeze_needs_a_report_and_a_known_value(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    agent = await stable()
    for call in (agent.assemble("conv-1", HOLD, report=False), agent.assemble("conv-1", 9)):
        error = await raw_failure(call)
        assert (error.code(), error_info(error).reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_VALUE",
        )
    assert "tool_freeze needs report = true" in (
        (await raw_failure(agent.assemble("conv-1", RELEASE, report=False))).details() or ""
    )


async def test_the_python_client_freezes_and_reads_the_order(
    stable: Callable[..., Awaitable[Stable]],
) -> None:
    client = (await stable()).client
    await client.tools([tool("bash"), tool("read")])
    await client.assemble(report=True, report_key="conv-1", tool_freeze="hold")
    await client.tools([tool("abc")])
    error = await rejection(client.assemble(report=True, report_key="conv-1"))
    assert failure(error) == frozen('tool "abc" would be added')
    released = await client.render(report=True, report_key="conv-1", tool_freeze="release")
    assert released.assembly.report is not None
    assert released.assembly.report.tool_order == dsp.ToolOrderReport(
        kept=True, position=0, sorted_tool="abc", kept_tool="bash"
    )
    assert tool_names(released.assembly) == ["bash", "read", "abc"]
    wrong = await rejection(client.assemble(report=True, tool_freeze="keep"))  # type: ignore[arg-type]
    assert (wrong.reason, wrong.message) == (
        "INVALID_VALUE",
        "tool_freeze must be one of hold, release, not 'keep'",
    )
