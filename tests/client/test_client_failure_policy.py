"""The Python client's `failure_policy=`: a provider or listener registered with
`dsp.FailurePolicy.IGNORE` that fails is skipped, and the assembly the client returns says
which step and why (`assembly.skipped`), without changing what the assembly equals."""

from __future__ import annotations

import asyncio
from typing import Any

import dsh_system_prompt as dsp
import grpc
import pytest
from dsh_system_prompt_server import Sidecar
from helpers import ClientOf, SidecarFactory, rejection, section_names, tool

IGNORE = dsp.FailurePolicy.IGNORE


def broken(_: dsp.AssembleContext) -> str:
    raise RuntimeError("no cwd here")


async def test_an_ignored_provider_that_raises_is_skipped_and_named_on_the_assembly(
    client: dsp.Client,
) -> None:
    await client.section("rules", 10, "Be precise.")
    await client.section("cwd", 20, broken, failure_policy=IGNORE)
    assembly = await client.assemble()
    assert section_names(assembly)[2:] == ["rules"]  # after the built-ins
    (step,) = assembly.skipped
    listed = [info for info in (await client.snapshot()).registrations if info.name == "cwd"]
    assert step == dsp.SkippedStep(
        kind="section",
        name="cwd",
        scope=None,
        ref=listed[0].ref,
        reason=dsp.Reason.PROVIDER_FAILED,
        message=step.message,
    )
    assert step.message.startswith('section provider "cwd" (global) failed: ')
    assert "no cwd here" in step.message


@pytest.mark.parametrize(("named", "skipped"), [("ignore", 1), ("fail", None)])
async def test_a_failure_policy_may_be_named_by_its_plain_string(
    client: dsp.Client, named: str, skipped: int | None
) -> None:
    await client.section("cwd", 20, broken, failure_policy=named)  # type: ignore[arg-type]
    if skipped is None:
        assert (await rejection(client.assemble())).reason is dsp.Reason.PROVIDER_FAILED
    else:
        assert len((await client.assemble()).skipped) == skipped


async def test_skipped_steps_are_not_part_of_the_assemblys_value(client: dsp.Client) -> None:
    await client.section("rules", 10, "Be precise.")
    off = await client.section("cwd", 20, broken, failure_policy=IGNORE)
    skipping = await client.assemble()
    await off()
    complete = await client.assemble()
    assert skipping.skipped and not complete.skipped
    assert skipping == complete
    assert "skipped" not in repr(skipping)


async def test_an_ignored_listener_that_raises_is_passed_over_and_later_ones_run(
    client: dsp.Client,
) -> None:
    async def weather(assembly: dsp.PromptAssembly, context: Any, next_: dsp.Next) -> Any:
        raise RuntimeError("no weather today")

    async def sign(assembly: dsp.PromptAssembly, context: Any, next_: dsp.Next) -> Any:
        assembly.sections.append(dsp.AssembledSection("signature", "-- the team"))
        return await next_()

    await client.on_assemble(weather, name="weather", failure_policy=IGNORE)
    await client.on_assemble(sign)
    rendered = await client.render()
    assert rendered.prompt.endswith("-- the team")
    assert [(s.kind, s.name, s.reason) for s in rendered.skipped] == [
        ("listener", "weather", dsp.Reason.LISTENER_FAILED)
    ]
    assert rendered.skipped == rendered.assembly.skipped


async def test_a_provider_under_fail_still_fails_the_assembly(client: dsp.Client) -> None:
    await client.section("cwd", 20, broken, failure_policy=dsp.FailurePolicy.FAIL)
    await client.tools(lambda _: [tool("extra")], failure_policy=IGNORE)
    with pytest.raises(dsp.SystemPromptError) as caught:
        await client.assemble()
    assert caught.value.reason is dsp.Reason.PROVIDER_FAILED


async def test_an_ignored_variable_that_fails_renders_as_a_variable_without_a_value(
    client: dsp.Client,
) -> None:
    await client.section("hi", 20, "Hi {{who}}.")
    await client.variable("who", broken, failure_policy=IGNORE)
    assembly = await client.assemble()
    assert assembly.variables["who"] is None
    assert [s.kind for s in assembly.skipped] == ["variable"]
    with pytest.raises(dsp.RenderError) as caught:
        await client.render()
    assert caught.value.message == (
        'prompt variable "{{who}}" has no value for this assembly (section "hi")'
    )


async def test_the_report_lists_the_skipped_steps(client: dsp.Client) -> None:
    await client.context("cwd", 1, broken, failure_policy=IGNORE)
    assembly = await client.assemble(report=True)
    assert assembly.report is not None
    assert assembly.report.skipped == assembly.skipped
    assert [s.kind for s in assembly.skipped] == ["context"]


async def test_an_ignored_provider_that_times_out_is_skipped_and_re_registered_as_ignored(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    calls = 0

    async def flaky(_: dsp.AssembleContext) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.sleep(5)  # a timeout: skipped, then ejected
        if calls == 3:
            raise RuntimeError("flaky")
        return "cwd: /src"

    async with dsp.connect(sidecar.address) as client:
        await client.section("cwd", 20, flaky, failure_policy=IGNORE)
        first = await client.assemble()
        await _re_registered(sidecar)
        second = await client.assemble()
        third = await client.assemble()  # registered again with its policy: skipped again
    assert [s.reason for s in first.skipped] == [dsp.Reason.PROVIDER_TIMEOUT]
    assert (section_names(second)[2:], second.skipped) == (["cwd"], ())
    assert [s.reason for s in third.skipped] == [dsp.Reason.PROVIDER_FAILED]


async def _re_registered(sidecar: Sidecar) -> None:
    for _ in range(200):  # the client registers an ejected provider again after ~1 s
        if any(e.name == "cwd" for e in sidecar.registry.registrations()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the ejected provider was not registered again")


@pytest.mark.parametrize(
    "register",
    [
        lambda c: c.section("rules", 1, "static", failure_policy=IGNORE),
        lambda c: c.context("rules", 1, "static", failure_policy=IGNORE),
        lambda c: c.variable("model", "v4", failure_policy=IGNORE),
        lambda c: c.variable("model", None, failure_policy=IGNORE),
        lambda c: c.tools([tool("echo")], failure_policy=IGNORE),
    ],
    ids=["section", "context", "variable", "no-value", "tools"],
)
async def test_failure_policy_on_a_static_value_is_refused_leaving_nothing(
    client_of: ClientOf, register: Any
) -> None:
    async with client_of() as client:
        with pytest.raises(dsp.SystemPromptError) as caught:
            await register(client)
        snapshot = await client.snapshot()
    assert (caught.value.code, caught.value.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        dsp.Reason.INVALID_VALUE,
    )
    assert caught.value.message == (
        "failure_policy= applies to a provider (a callable), not to a static value"
    )
    assert [info.name for info in snapshot.registrations if info.owner_label != "built-in"] == []


async def test_a_failure_policy_that_is_not_one_is_refused(client: dsp.Client) -> None:
    with pytest.raises(dsp.SystemPromptError) as caught:
        await client.section("cwd", 20, broken, failure_policy="sometimes")  # type: ignore[arg-type]
    assert caught.value.reason is dsp.Reason.INVALID_VALUE
    assert caught.value.message == (
        "failure_policy must be dsp.FailurePolicy.FAIL or .IGNORE, not 'sometimes'"
    )


async def test_a_refused_failure_policy_keeps_no_provider_in_the_client(
    client: dsp.Client,
) -> None:
    kept = client._connection.providers  # what the client answers ProvideRequests from
    for _ in range(3):
        with pytest.raises(dsp.SystemPromptError):
            await client.section("cwd", 20, broken, failure_policy="sometimes")  # type: ignore[arg-type]
    assert len(kept) == 0
