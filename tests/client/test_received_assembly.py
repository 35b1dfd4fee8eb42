"""A received assembly converts its parts only as they are read, and is a value like
a built one: it compares, copies, pickles, replaces and renders the same."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import AsyncIterator

import dsh_system_prompt as dsp
import pytest
from helpers import SidecarFactory, tool

PARTS = ("sections", "contexts", "tools", "variables")


@pytest.fixture
async def loaded(make_sidecar: SidecarFactory) -> AsyncIterator[dsp.Client]:
    """A client of a sidecar holding one part of each kind: `expected()` assembles."""
    sidecar = await make_sidecar(include_harness_identity=False)
    async with dsp.connect(sidecar.address) as client:
        await client.section("role", 1, "You help {{user}}.")
        await client.context("cwd", 1, "Working in /tmp.")
        await client.tools([tool("read_file", "Reads a file.")])
        await client.variable("user", "Ada")
        await client.variable("absent", None)
        yield client


def expected() -> dsp.PromptAssembly:
    return dsp.PromptAssembly(
        sections=[
            dsp.AssembledSection(dsp.PERSONA_SECTION, ""),
            dsp.AssembledSection("role", "You help {{user}}."),
        ],
        contexts=[dsp.AssembledContext("cwd", "Working in /tmp.")],
        tools=[tool("read_file", "Reads a file.")],
        variables={"user": "Ada", "absent": None},
    )


def converted(assembly: dsp.PromptAssembly) -> list[str]:
    return [part for part in PARTS if part in vars(assembly)]


async def test_assemble_converts_no_part_until_it_is_read(loaded: dsp.Client) -> None:
    assembly = await loaded.assemble()
    assert converted(assembly) == []
    assert [s.name for s in assembly.sections] == [dsp.PERSONA_SECTION, "role"]
    assert converted(assembly) == ["sections"]


async def test_received_assembly_equals_the_hand_built_one(loaded: dsp.Client) -> None:
    assert await loaded.assemble() == expected()
    assert expected() == await loaded.assemble()
    assert (await loaded.render()).assembly == expected()


async def test_a_part_assigned_before_it_is_read_is_kept(loaded: dsp.Client) -> None:
    assembly = await loaded.assemble()
    assembly.sections = [dsp.AssembledSection("mine", "Only this.")]
    assembly.variables["extra"] = "x"
    assert assembly.sections == [dsp.AssembledSection("mine", "Only this.")]
    assert assembly.variables == {"user": "Ada", "absent": None, "extra": "x"}
    assert assembly.contexts == expected().contexts
    assert assembly.tools == expected().tools


async def test_received_assembly_copies_pickles_and_replaces_like_a_built_one(
    loaded: dsp.Client,
) -> None:
    received = await loaded.assemble()
    assert copy.copy(received) == expected()
    assert copy.deepcopy(await loaded.assemble()) == expected()
    assert pickle.loads(pickle.dumps(await loaded.assemble())) == expected()
    replaced = dataclasses.replace(await loaded.assemble(), contexts=[])
    assert replaced == dataclasses.replace(expected(), contexts=[])
    assert dataclasses.asdict(await loaded.assemble()) == dataclasses.asdict(expected())
    assert repr(await loaded.assemble()) == repr(expected())


async def test_received_assembly_renders_like_the_sidecar(loaded: dsp.Client) -> None:
    rendered = await loaded.render()
    assert dsp.render_prompt(await loaded.assemble()) == rendered.prompt
    assert dsp.render_context_snapshot(await loaded.assemble()) == rendered.context_snapshot


async def test_an_unknown_attribute_is_still_an_attribute_error(loaded: dsp.Client) -> None:
    assembly = await loaded.assemble()
    assert not hasattr(assembly, "prompt")
    assert assembly.report is None
