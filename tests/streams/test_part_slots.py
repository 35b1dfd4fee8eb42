"""Part slots (docs/protocol.md, "Part slots"): a listener stream names unchanged parts by
slot, both ways, against the stream's base and each invocation; what a listener does to
its assembly comes out the same as in full, and a peer without the feature is served."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar
from helpers import RawListener, eventually, raw_listener, tool
from scripted import Script, ScriptedSidecar, connect, taken, wire_tool

grpc_max_workers = 32  # pytest-grpc: each open stream of the scripted sidecar holds a thread

Change = Callable[[dsp.PromptAssembly], None]


def reorder(assembly: dsp.PromptAssembly) -> None:
    assembly.sections.reverse()
    assembly.contexts.reverse()
    assembly.tools.reverse()
    assembly.variables = dict(reversed(assembly.variables.items()))


def remove(assembly: dsp.PromptAssembly) -> None:
    del assembly.sections[1], assembly.contexts[0], assembly.tools[-1]
    del assembly.variables["mode"]


def replace(assembly: dsp.PromptAssembly) -> None:
    assembly.sections[-1].text = "changed in place"
    assembly.contexts[-1] = dsp.AssembledContext(assembly.contexts[-1].name, "a new text")
    assembly.tools[0] = dsp.ToolSchema(assembly.tools[0].name, "a new description", {})
    assembly.tools[1].parameters["title"] = "changed in place"
    assembly.variables["mode"] = "replaced"
    assembly.variables["user"] = None


def add(assembly: dsp.PromptAssembly) -> None:
    assembly.sections.insert(0, dsp.AssembledSection("added", "a new section"))
    assembly.contexts.append(dsp.AssembledContext("added", "a new context"))
    assembly.tools.append(tool("added"))
    assembly.variables["added"] = "a new variable"


CHANGES = [reorder, remove, replace, add]


def before_next(change: Change) -> Any:
    async def listener(assembly: dsp.PromptAssembly, context: Any, next_: Any) -> Any:
        change(assembly)
        return next_()

    return listener


def after_next(change: Change) -> Any:
    async def listener(assembly: dsp.PromptAssembly, context: Any, next_: Any) -> Any:
        result: dsp.PromptAssembly = await next_()
        change(result)
        return result

    return listener


async def load(client: dsp.Client) -> None:
    """Three parts of each kind."""
    for order, name in enumerate(("rules", "style", "notes")):
        await client.section(name, 10 + order, f"the {name} section")
    await client.context("cwd", 1, "/work")
    await client.context("branch", 2, "main")
    await client.tools([tool("bash"), tool("read", "reads a file"), tool("grep")])
    for name, value in (("mode", "fast"), ("user", "ann"), ("host", "box")):
        await client.variable(name, value)


def changed(assembly: dsp.PromptAssembly, change: Change) -> dsp.PromptAssembly:
    expected = copy.deepcopy(assembly)
    change(expected)
    return expected


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("around", [before_next, after_next])
async def test_a_listener_s_changes_come_out_as_if_every_part_were_sent(
    client: dsp.Client, change: Change, around: Callable[[Change], Any]
) -> None:
    await load(client)
    plain = await client.assemble()
    await client.on_assemble(around(change))
    first = await client.assemble()
    # A change to the registry: the next invocation differs from the stream's base.
    await client.section("late", 11.5, "registered between two assemblies")
    await client.variable("extra", "x")
    grown = await client.assemble()
    again = await client.assemble()  # the base is now the assembly before
    assert first == changed(plain, change)
    late = dsp.AssembledSection("late", "registered between two assemblies")
    plain.sections.insert([s.name for s in plain.sections].index("notes"), late)
    plain.variables["extra"] = "x"
    assert grown == again == changed(plain, change)


async def test_chained_listeners_each_change_what_the_one_before_handed_on(
    client: dsp.Client,
) -> None:
    await load(client)
    plain = await client.assemble()
    for listener in (before_next(add), before_next(replace), after_next(reorder)):
        await client.on_assemble(listener)
    await client.on_assemble(before_next(remove))
    assemblies = [await client.assemble() for _ in range(2)]
    expected = changed(plain, lambda a: (add(a), replace(a), remove(a), reorder(a)))
    assert assemblies == [expected, expected]


def repeat_tools(assembly: dsp.PromptAssembly) -> None:
    assembly.tools = [assembly.tools[0]] * 5  # more parts than the three held: not all by slot


async def test_a_listener_may_repeat_an_unchanged_part_more_often_than_parts_are_held(
    client: dsp.Client,
) -> None:
    await load(client)
    plain = await client.assemble()

    async def repeat_sections(assembly: dsp.PromptAssembly, context: Any, next_: Any) -> Any:
        unique = list(assembly.sections)
        assembly.sections = [unique[0]] * 4 + unique  # handed on with names repeated
        result: dsp.PromptAssembly = await next_(assembly)
        assert result.sections == [unique[0]] * 4 + unique  # as the rest of the chain saw them
        result.sections = unique
        return result

    await client.on_assemble(repeat_sections)
    await client.on_assemble(after_next(repeat_tools))
    assemblies = [await client.assemble() for _ in range(2)]  # the second against a base
    expected = changed(plain, repeat_tools)
    assert assemblies == [expected, expected]


# -- the wire, as a client in another language sees it -----------------------------------


@asynccontextmanager
async def listening(
    sidecar: Sidecar, client: dsp.Client, *features: str
) -> AsyncIterator[RawListener]:
    """A raw listener with `features` (all confirmed), over `load`ed registrations."""
    await load(client)
    async with raw_listener(sidecar, *features) as raw:
        assert list(raw.registered.features) == list(features)
        yield raw


def names(parts: Any) -> list[str]:
    return [part.name for part in parts]


def everything(invocation: pb.ListenerInvocation) -> pb.PartSlots:
    """Slots naming each part of `invocation`, unchanged and in order."""
    counts = {
        kind: len(getattr(invocation.slots, kind)) or len(getattr(invocation.assembly, kind))
        for kind in ("sections", "contexts", "tools", "variables")
    }
    return pb.PartSlots(**{kind: range(count) for kind, count in counts.items()})


async def test_invocations_send_only_what_changed_against_the_stream_s_base(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with listening(sidecar, client, "part-slots") as raw:
        assembling, first = await raw.invoked_by(client)
        assert not first.HasField("slots")  # no base yet: every part in full
        await raw.send(next=pb.ListenerNext(invocation_id=first.invocation_id, tail=True))
        await assembling
        await client.section("late", 0.5, "new")
        assembling, second = await raw.invoked_by(client)
        sections = names(first.assembly.sections)
        assert [slot for slot in second.slots.sections if slot >= 0] == list(range(len(sections)))
        assert list(second.slots.sections).count(-1) == 1
        assert names(second.assembly.sections) == ["late"]
        now = [sections[slot] if slot >= 0 else "late" for slot in second.slots.sections]
        assert list(second.slots.tools) == [0, 1, 2] and not second.assembly.tools
        assert list(second.slots.contexts) == [0, 1] and not second.assembly.contexts
        assert list(second.slots.variables) == [0, 1, 2] and not second.assembly.variables
        # Reply by slot against this invocation: drop a tool, reorder sections, add one.
        reply = pb.ListenerResult(
            invocation_id=second.invocation_id,
            assembly=pb.PromptAssembly(sections=[pb.AssembledSection(name="mine", text="m")]),
            slots=pb.PartSlots(
                sections=[2, 1, -1], contexts=[1], tools=[2, 0], variables=[2, 0, 1]
            ),
        )
        await raw.send(result=reply)
        assembly = await assembling
    assert names(assembly.sections) == [now[2], now[1], "mine"]
    tools, variables = names(first.assembly.tools), names(first.assembly.variables)
    assert names(assembly.contexts) == [names(first.assembly.contexts)[1]]
    assert names(assembly.tools) == [tools[2], tools[0]]
    assert list(assembly.variables) == [variables[2], variables[0], variables[1]]


async def test_an_unchanged_scope_s_invocation_names_every_part_by_slot_and_sends_none(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with listening(sidecar, client, "part-slots") as raw:
        for _ in range(2):  # the first in full, the second against it as the base
            assembling, first = await raw.invoked_by(client)
            handed = pb.ListenerNext(
                invocation_id=first.invocation_id, tail=True, slots=everything(first)
            )
            await raw.send(next=handed)
            plain = await assembling
        assembling, again = await raw.invoked_by(client)
        assert again.slots == everything(first)
        assert again.assembly == pb.PromptAssembly()
        # a reply by slot against it reads the base's parts
        reply = pb.ListenerResult(
            invocation_id=again.invocation_id,
            slots=pb.PartSlots(sections=[2, 0], contexts=[0, 1], tools=[1], variables=[0]),
        )
        await raw.send(result=reply)
        assembly = await assembling
    sections = names(plain.sections)
    assert names(assembly.sections) == [sections[2], sections[0]]
    assert names(assembly.contexts) == names(plain.contexts)
    assert names(assembly.tools) == [names(plain.tools)[1]]
    assert list(assembly.variables) == [next(iter(plain.variables))]


async def test_what_the_first_listener_is_handed_stays_whole_after_an_assembly_went_without_it(
    client: dsp.Client,
) -> None:
    """The assembly a plan's first listener is handed is kept between assemblies; one
    that skipped its only listener (IGNORE) and then enforced its complete section did not
    change it."""
    await load(client)
    await client.section("exact", 50, "the complete prompt", complete=True)
    handed: list[list[str]] = []

    async def fails_once(
        assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: Any
    ) -> Any:
        handed.append([section.name for section in assembly.sections])
        if len(handed) == 1:
            raise RuntimeError("not this time")
        return next_()

    await client.on_assemble(fails_once, failure_policy=dsp.FailurePolicy.IGNORE)
    skipped = await client.assemble()
    served = await client.assemble()
    assert names(skipped.sections) == names(served.sections) == ["exact"]
    assert handed[0][-4:] == ["rules", "style", "notes", "exact"]
    assert handed[1] == handed[0]


async def test_next_results_name_unchanged_parts_against_the_invocation(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with listening(sidecar, client, "part-slots") as raw:
        assembling, invocation = await raw.invoked_by(client)
        handed = pb.PromptAssembly(
            sections=[pb.AssembledSection(name="new", text="from the listener")]
        )
        slots = pb.PartSlots(sections=[-1, 0], contexts=[1, 0], tools=[1], variables=[0])
        await raw.send(
            next=pb.ListenerNext(
                invocation_id=invocation.invocation_id, assembly=handed, slots=slots
            )
        )
        result = (await raw.stream.read()).next_result
        await raw.send(
            result=pb.ListenerResult(
                invocation_id=invocation.invocation_id, assembly=result.assembly, slots=result.slots
            )
        )
        assembly = await assembling
    assert list(result.slots.sections) == [-1, 0] and names(result.assembly.sections) == ["new"]
    assert list(result.slots.contexts) == [1, 0] and not result.assembly.contexts
    assert list(result.slots.tools) == [1] and list(result.tool_slots) == []
    assert names(assembly.sections)[0] == "new"
    assert names(assembly.tools) == [names(invocation.assembly.tools)[1]]


@pytest.mark.parametrize(
    ("slots", "fresh", "words"),
    [
        (pb.PartSlots(sections=[0, 99]), pb.PromptAssembly(), "section slot 99 is out of range"),
        (pb.PartSlots(variables=[-2]), pb.PromptAssembly(), "variable slot -2 is out of range"),
        (pb.PartSlots(contexts=[-1, -1]), pb.PromptAssembly(), "more -1 context slots than"),
        (
            pb.PartSlots(sections=[0]),
            pb.PromptAssembly(sections=[pb.AssembledSection(name="x", text="y")]),
            "more sections sent than -1 section slots",
        ),
        (pb.PartSlots(tools=[0]), pb.PromptAssembly(), "both tool_slots and slots.tools"),
        (
            pb.PartSlots(sections=[0] * 100_000),
            pb.PromptAssembly(),
            "more section slots than the sections held and sent",
        ),
    ],
    ids=[
        "past-the-end",
        "below-minus-one",
        "fresh-missing",
        "fresh-extra",
        "both-tool-slots",
        "more-than-held",
    ],
)
async def test_a_reply_with_bad_slots_fails_that_assembly_and_the_stream_serves_on(
    sidecar: Sidecar, client: dsp.Client, slots: pb.PartSlots, fresh: pb.PromptAssembly, words: str
) -> None:
    async with listening(sidecar, client, "part-slots") as raw:
        assembling, first = await raw.invoked_by(client)
        tool_slots = [0] if slots.tools else []
        bad = pb.ListenerResult(
            invocation_id=first.invocation_id,
            assembly=fresh,
            slots=slots,
            tool_slots=tool_slots,
        )
        await raw.send(result=bad)
        with pytest.raises(dsp.SystemPromptError) as failure:
            await assembling
        assembling, invocation = await raw.invoked_by(client)
        handed = pb.ListenerNext(
            invocation_id=invocation.invocation_id, tail=True, slots=everything(invocation)
        )
        await raw.send(next=handed)
        assembly = await assembling
    assert (failure.value.code, failure.value.reason) == (
        grpc.StatusCode.ABORTED,
        dsp.Reason.LISTENER_FAILED,
    )
    assert 'listener "raw" failed: ' in failure.value.message and words in failure.value.message
    assert names(assembly.tools) == names(first.assembly.tools)


async def test_a_peer_without_the_feature_gets_every_part_in_full(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    async with listening(sidecar, client, "tool-slots") as raw:
        invocations = []
        for _ in range(2):
            assembling, invocation = await raw.invoked_by(client)
            invocations.append(invocation)
            next_ = pb.ListenerNext(invocation_id=invocation.invocation_id)
            await raw.send(next=next_)
            result = (await raw.stream.read()).next_result
            await raw.send(
                result=pb.ListenerResult(
                    invocation_id=invocation.invocation_id, assembly=result.assembly
                )
            )
            await assembling
    for invocation in invocations:
        assert not invocation.HasField("slots")
        assert sorted(names(invocation.assembly.tools)) == ["bash", "grep", "read"]
        assert len(invocation.assembly.variables) == 3
    assert not result.HasField("slots") and list(result.tool_slots) == []


# -- the Python client against a scripted sidecar ----------------------------------------


class PartSlots(Script):
    listener_features = ("tool-slots", "part-slots")


def invocation(invocation_id: int, slots: pb.PartSlots | None, *tools: pb.ToolSchema) -> Any:
    message = pb.ListenerInvocation(
        invocation_id=invocation_id, assembly=pb.PromptAssembly(tools=tools), slots=slots
    )
    return pb.ListenResponse(invocation=message)


async def test_the_client_reads_invocations_against_its_base_and_replies_by_slot(
    scripted: ScriptedSidecar,
) -> None:
    scripted.script = PartSlots()
    seen: list[list[str]] = []

    async def listener(assembly: dsp.PromptAssembly, context: Any, next_: Any) -> Any:
        seen.append(names(assembly.tools))
        assembly.tools.pop(0)
        return next_()

    async with connect(scripted) as client:
        await client.on_assemble(listener)
        stream = scripted.script.listeners[0]
        stream.outbox.put(invocation(1, None, wire_tool("a"), wire_tool("b")))
        first = (await taken(stream)).next
        stream.outbox.put(invocation(2, pb.PartSlots(tools=[1, -1, 0]), wire_tool("c")))
        second = (await taken(stream)).next
    assert seen == [["a", "b"], ["b", "c", "a"]]
    assert list(first.slots.tools) == [1] and list(first.assembly.tools) == []
    assert list(second.slots.tools) == [1, 2] and list(first.tool_slots) == []
    assert list(second.slots.sections) == [] and list(second.slots.variables) == []


@pytest.mark.parametrize(
    ("slots", "words"),
    [
        (pb.PartSlots(tools=[3]), "tool slot 3"),
        (pb.PartSlots(tools=[0, 0]), "2 tool slots, more than the 1 tools held and 0 sent"),
    ],
    ids=["past-the-end", "more-than-held"],
)
async def test_the_client_that_cannot_read_an_invocation_fails_it_and_listens_anew(
    scripted: ScriptedSidecar, slots: pb.PartSlots, words: str
) -> None:
    scripted.script = PartSlots()

    async with connect(scripted) as client:
        await client.on_assemble(before_next(lambda assembly: None))
        stream = scripted.script.listeners[0]
        stream.outbox.put(invocation(1, None, wire_tool("a")))  # the base: one tool
        await taken(stream)
        stream.outbox.put(invocation(2, slots))
        reply = await taken(stream)
        await eventually(
            lambda: len(scripted.script.listeners) == 2, "the listener is installed again"
        )
    assert reply.WhichOneof("kind") == "failure"
    assert words in reply.failure.message


async def test_the_client_sends_tool_slots_alone_to_a_sidecar_without_part_slots(
    scripted: ScriptedSidecar,
) -> None:
    async with connect(scripted) as client:
        await client.on_assemble(before_next(remove))
        stream = scripted.script.listeners[0]
        assert "part-slots" in stream.start.start.features  # offered, not confirmed
        message = pb.PromptAssembly(
            sections=[pb.AssembledSection(name=n, text=n) for n in "abc"],
            contexts=[pb.AssembledContext(name="c", text="c")],
            tools=[wire_tool("t0"), wire_tool("t1")],
            variables=[pb.Variable(name="mode", value="m")],
        )
        invoked = pb.ListenerInvocation(invocation_id=1, assembly=message)
        stream.outbox.put(pb.ListenResponse(invocation=invoked))
        sent = (await taken(stream)).next
    assert not sent.HasField("slots")
    assert list(sent.tool_slots) == [0]
    assert names(sent.assembly.sections) == ["a", "c"] and list(sent.assembly.contexts) == []
