"""Sessions own registrations: they end with the session, and only their owner disposes them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import (
    BUILTIN_SECTIONS,
    ClientFactory,
    context_names,
    eventually,
    raw_channel,
    raw_stub,
    section_names,
    tool,
    tool_names,
)


def _registration_ids(sidecar: Sidecar, client: dsp.Client) -> list[str]:
    return [entry.id for entry in sidecar.registry.registrations(client.session_id)]


def _builtin_ids(sidecar: Sidecar) -> list[str]:
    return [
        entry.id
        for entry in sidecar.registry.registrations()
        if entry.kind.value == "section" and entry.name in BUILTIN_SECTIONS
    ]


async def _raw_dispose(address: str, session_id: str, registration_id: str) -> grpc.StatusCode:
    """Dispose over the wire; the status code the sidecar answered with."""
    async with raw_channel(address) as channel:
        try:
            await raw_stub(channel).Dispose(
                pb.DisposeRequest(session_id=session_id, registration_id=registration_id),
                timeout=5,
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


# -- a closing session takes its registrations with it -------------------------------


async def _adds_a_section(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: object
) -> dsp.PromptAssembly:
    assembly.sections.append(dsp.AssembledSection("from-listener", "added"))
    return assembly


# What a closing client takes with it, by kind: the registering method, its calls (a static
# and a dynamic one where the kind has both) and what another client's assembly shows of them.
OWNED = [
    pytest.param(
        "section",
        [("static", 10, "static text"), ("dynamic", 20, lambda ctx: "dynamic text")],
        lambda assembly: section_names(assembly)[len(BUILTIN_SECTIONS) :],
        ["static", "dynamic"],
        id="sections",
    ),
    pytest.param(
        "context",
        [("static", 1, "mode: plan"), ("dynamic", 2, lambda ctx: "mode: act")],
        context_names,
        ["static", "dynamic"],
        id="contexts",
    ),
    pytest.param(
        "tools",
        [([tool("bash")],), (lambda ctx: [tool("todo_write")],)],
        tool_names,
        ["bash", "todo_write"],
        id="tools",
    ),
    pytest.param(
        "variable",
        [("model", "deepseek-v4"), ("who", lambda ctx: "alice")],
        lambda assembly: assembly.variables,
        {"model": "deepseek-v4", "who": "alice"},
        id="variables",
    ),
    pytest.param(
        "on_assemble",
        [(_adds_a_section,)],
        lambda assembly: section_names(assembly)[len(BUILTIN_SECTIONS) :],
        ["from-listener"],
        id="listeners",
    ),
]


@pytest.mark.parametrize(("method", "calls", "seen", "shown"), OWNED)
async def test_closing_a_client_removes_its_registrations_from_other_clients_assemblies(
    connect: ClientFactory,
    method: str,
    calls: list[tuple[object, ...]],
    seen: Callable[[dsp.PromptAssembly], object],
    shown: object,
) -> None:
    owner, other = await connect(), await connect()
    for args in calls:
        await getattr(owner, method)(*args)
    assert seen(await other.assemble()) == shown

    await owner.close()

    assert not seen(await other.assemble())


async def test_closing_a_client_removes_its_scope_layers_from_other_clients_assemblies(
    connect: ClientFactory,
) -> None:
    owner, other = await connect(), await connect()
    scope = await owner.scope("agent-1")
    await scope.section("agent-rules", 10, "only for agent-1")
    await scope.variable("agent", "agent-1")
    assert section_names(await other.assemble(scope="agent-1"))[-1] == "agent-rules"

    await owner.close()

    assembly = await other.assemble(scope="agent-1")
    assert section_names(assembly) == list(BUILTIN_SECTIONS)
    assert assembly.variables == {}


async def test_closing_a_client_releases_its_scope_parent_binding(
    connect: ClientFactory,
) -> None:
    owner, other = await connect(), await connect()
    await owner.scope("child", parent="parent-a")

    await owner.close()

    # Nothing holds "child" any more, so another session may bind another parent.
    await other.scope("child", parent="parent-b")
    parent = await other.scope("parent-b")
    await parent.section("from-b", 10, "b")
    assert section_names(await other.assemble(scope="child"))[2:] == ["from-b"]


async def test_closing_a_client_lifts_its_runtime_context_suppression(
    connect: ClientFactory,
) -> None:
    owner, other = await connect(), await connect()
    await other.context("policy", 1, "mode: plan")
    await owner.suppress_runtime_context()
    assert (await other.assemble()).contexts == []

    await owner.close()

    assert context_names(await other.assemble()) == ["policy"]


async def test_closing_one_client_keeps_the_other_clients_registrations(
    connect: ClientFactory,
) -> None:
    owner, other = await connect(), await connect()
    await owner.section("mine", 10, "owner's")
    await owner.variable("model", "deepseek-v4")
    await other.section("theirs", 20, "other's")
    await other.tools([tool("echo")])
    await other.variable("cwd", "/srv")

    await owner.close()

    assembly = await other.assemble()
    assert section_names(assembly) == [*BUILTIN_SECTIONS, "theirs"]
    assert tool_names(assembly) == ["echo"]
    assert assembly.variables == {"cwd": "/srv"}


async def test_a_closed_clients_section_name_is_free_for_another_client(
    connect: ClientFactory,
) -> None:
    owner, other = await connect(), await connect()
    await owner.section("rules", 10, "old rules")

    await owner.close()
    await other.section("rules", 10, "new rules")

    assert (await other.assemble()).sections[-1] == dsp.AssembledSection("rules", "new rules")


# -- disposal belongs to the owner ---------------------------------------------------


async def test_a_disposer_disposes_only_its_own_registration(connect: ClientFactory) -> None:
    first, second = await connect(), await connect()
    off = await first.section("one", 10, "1")
    await first.section("two", 20, "2")
    await second.section("three", 30, "3")

    await off()

    assert section_names(await second.assemble()) == [*BUILTIN_SECTIONS, "two", "three"]


async def test_a_stale_disposer_does_not_dispose_another_clients_registration_of_that_name(
    connect: ClientFactory,
) -> None:
    first, second = await connect(), await connect()
    off = await first.section("rules", 10, "first's")
    await off()
    await second.section("rules", 10, "second's")

    await off()  # idempotent: the name now belongs to someone else

    assert (await second.assemble()).sections[-1] == dsp.AssembledSection("rules", "second's")


async def test_a_session_cannot_dispose_another_sessions_registration(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    owner, intruder = await connect(), await connect()
    await owner.section("owned", 10, "owner's")
    (registration_id,) = _registration_ids(sidecar, owner)

    code = await _raw_dispose(sidecar.address, intruder.session_id, registration_id)

    assert code == grpc.StatusCode.NOT_FOUND
    assert section_names(await intruder.assemble())[-1] == "owned"


async def test_disposing_an_unknown_registration_is_not_found(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    code = await _raw_dispose(sidecar.address, client.session_id, "no-such-registration")
    assert code == grpc.StatusCode.NOT_FOUND


async def test_disposing_a_registration_twice_over_the_wire_is_not_found_the_second_time(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("once", 10, "x")
    (registration_id,) = _registration_ids(sidecar, client)

    assert await _raw_dispose(sidecar.address, client.session_id, registration_id) == (
        grpc.StatusCode.OK
    )
    assert await _raw_dispose(sidecar.address, client.session_id, registration_id) == (
        grpc.StatusCode.NOT_FOUND
    )


async def test_a_registration_naming_an_unknown_session_fails_failed_precondition(
    sidecar: Sidecar,
) -> None:
    async with raw_channel(sidecar.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw_stub(channel).RegisterSection(
                pb.RegisterSectionRequest(
                    session_id="no-such-session", name="x", order=1, text="x"
                ),
                timeout=5,
            )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "x" not in [entry.name for entry in sidecar.registry.registrations()]


async def test_a_dispose_naming_an_unknown_session_fails_failed_precondition(
    sidecar: Sidecar,
) -> None:
    (identity_id, _) = _builtin_ids(sidecar)
    code = await _raw_dispose(sidecar.address, "no-such-session", identity_id)
    assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_call_naming_a_closed_session_fails_failed_precondition(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    closed = await connect()
    session_id = closed.session_id
    await closed.close()

    async with raw_channel(sidecar.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw_stub(channel).RegisterVariable(
                pb.RegisterVariableRequest(session_id=session_id, name="late", value="x"),
                timeout=5,
            )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_registering_through_a_closed_client_fails_failed_precondition(
    connect: ClientFactory,
) -> None:
    # Spec: every client failure is a SystemPromptError; a call on a closed
    # session is FAILED_PRECONDITION.
    closed = await connect()
    await closed.close()

    with pytest.raises(dsp.SystemPromptError) as caught:
        await closed.section("late", 10, "too late")
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION


# -- a crashed client ----------------------------------------------------------------

_CHILD = """
import asyncio, sys
import dsh_system_prompt as dsp

async def main() -> None:
    client = await dsp.connect(sys.argv[1])
    if sys.argv[2] == "dynamic":
        await client.section("doomed", 50, lambda ctx: "from the child (dynamic)")
    else:
        await client.section("doomed", 50, "from the child")
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


async def _start_child(address: str, mode: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        address,
        mode,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 15)
        if line.strip() != b"ready":
            assert process.stderr is not None
            process.kill()
            _, err = await asyncio.wait_for(process.communicate(), 5)
            pytest.fail(f"child did not get ready: {line!r} {err.decode()[-2000:]}")
    except BaseException:
        await _reap(process)
        raise
    return process


async def _reap(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(process.wait(), 5)


async def _lacks(client: dsp.Client, name: str) -> bool:
    """Whether an assembly (which must return promptly) lacks section `name`."""
    try:
        assembly = await client.assemble(timeout=2)
    except dsp.SystemPromptError as error:
        # A provider whose session ends while it is asked fails that assembly.
        assert error.code == grpc.StatusCode.UNAVAILABLE, error
        return False
    return name not in section_names(assembly)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
async def test_a_killed_clients_section_disappears(
    sidecar: Sidecar, client: dsp.Client, mode: str
) -> None:
    process = await _start_child(sidecar.address, mode)
    try:
        assert "doomed" in section_names(await client.assemble(timeout=5))

        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), 5)

        await eventually(
            lambda: _lacks(client, "doomed"), "the killed client's section goes", timeout=10
        )
    finally:
        await _reap(process)
    assert "doomed" not in [entry.name for entry in sidecar.registry.registrations()]


# -- the built-ins belong to the sidecar ---------------------------------------------


async def test_no_session_can_dispose_the_built_in_sections(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    first, second = await connect(), await connect()
    builtin_ids = _builtin_ids(sidecar)
    assert len(builtin_ids) == 2

    for session in (first, second):
        for registration_id in builtin_ids:
            code = await _raw_dispose(sidecar.address, session.session_id, registration_id)
            assert code == grpc.StatusCode.NOT_FOUND

    assert section_names(await first.assemble()) == list(BUILTIN_SECTIONS)


async def test_a_dispose_with_an_empty_session_id_cannot_touch_the_built_ins(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    for registration_id in _builtin_ids(sidecar):
        code = await _raw_dispose(sidecar.address, "", registration_id)
        assert code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)

    assert section_names(await client.assemble()) == list(BUILTIN_SECTIONS)


async def test_the_built_ins_survive_every_session_closing(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    clients = [await connect() for _ in range(3)]
    for index, each in enumerate(clients):
        await each.section(f"s{index}", 10 + index, "x")
    for each in clients:
        await each.close()

    async with dsp.connect(sidecar.address) as late:
        assembly = await late.assemble()
    assert assembly.sections == [
        dsp.AssembledSection(
            "harness:identity", "You are an AI agent powered by DeepSeek Harness."
        ),
        dsp.AssembledSection(dsp.PERSONA_SECTION, ""),
    ]


async def test_after_all_clients_close_only_the_built_ins_are_registered(
    sidecar: Sidecar, connect: ClientFactory
) -> None:
    first, second = await connect(), await connect()

    async def listener(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next: object
    ) -> dsp.PromptAssembly:
        return assembly

    for each in (first, second):
        await each.context(f"c-{each.session_id}", 1, "y")
        await each.tools(lambda ctx: [tool("bash")])
        await each.suppress_runtime_context()
        await each.on_assemble(listener)
        scope = await each.scope(f"agent-{each.session_id}")
        await scope.section("scoped", 10, lambda ctx: "w")
        await scope.variable("v", "z")
    await first.section("s", 10, "x")
    await second.variable("model", "deepseek-v4")

    await first.close()
    await second.close()

    remaining = sidecar.registry.registrations()
    assert sorted((entry.kind.value, entry.name) for entry in remaining) == [
        ("section", "deployment:persona"),
        ("section", "harness:identity"),
    ]
    assert sidecar.registry.scope_keys() == []
