"""Issue 22's failure policy on the wire: a provider or listener registered with
FAILURE_POLICY_IGNORE that fails or does not answer is skipped, the assembly goes on without
it, and the response, its trailer, its report and the metrics say which step and why."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, metric, raw_channel, raw_stub

Stub = pb_grpc.SystemPromptServiceStub
IGNORE = pb.FAILURE_POLICY_IGNORE
# What a raw session answers one provider call with; None: it never answers that request.
Answer = Callable[[pb.ProvideCall], pb.ProvidedValue | None]
# What a raw listener answers an invocation or a next result with.
Reply = Callable[[pb.ListenResponse], pb.ListenRequest]


def text(value: str) -> Answer:
    return lambda call: pb.ProvidedValue(provider_key=call.provider_key, text=value)


def error(message: str) -> Answer:
    return lambda call: pb.ProvidedValue(
        provider_key=call.provider_key, error=pb.ProviderError(message=message)
    )


def silent(call: pb.ProvideCall) -> None:
    return None


def by_key(**answers: Answer) -> Answer:
    return lambda call: answers[call.provider_key](call)


class Session:
    """A raw session on a sidecar, answering its provider calls with `answer`."""

    def __init__(self, stub: Stub, answer: Answer) -> None:
        self.stub = stub
        self.answer = answer
        self.asked: list[str] = []  # provider keys, in the order asked
        self.id = ""
        self._call: Any = None
        self._serving: asyncio.Task[None] | None = None

    async def open(self) -> None:
        self._call = self.stub.OpenSession()
        await self._call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="t")))
        self.id = (await self._call.read()).opened.session_id
        self._serving = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while (message := await self._call.read()) is not grpc.aio.EOF:
            if message.WhichOneof("kind") != "provide":
                continue
            self.asked.extend(call.provider_key for call in message.provide.calls)
            values = [self.answer(call) for call in message.provide.calls]
            if all(value is not None for value in values):
                provided = pb.ProvideResponse(call_id=message.provide.call_id, values=values)
                await self._call.write(pb.OpenSessionRequest(provided=provided))

    def close(self) -> None:
        if self._serving is not None:
            self._serving.cancel()
        self._call.cancel()

    async def section(self, name: str, order: float = 20, **dynamic: Any) -> str:
        request = pb.RegisterSectionRequest(
            session_id=self.id,
            name=name,
            order=order,
            dynamic=pb.Dynamic(provider_key=name, **dynamic),
        )
        return (await self.stub.RegisterSection(request)).registration_id

    async def provider(self, kind: str, name: str, **dynamic: Any) -> None:
        """A variable or tool provider (`kind`) `name`, asked of this session by that key."""
        registers = {
            "variable": (pb.RegisterVariableRequest, self.stub.RegisterVariable),
            "tools": (pb.RegisterToolsRequest, self.stub.RegisterTools),
        }
        request, rpc = registers[kind]
        given = pb.Dynamic(provider_key=name, **dynamic)
        await rpc(request(session_id=self.id, name=name, dynamic=given))

    async def listener(self, name: str, reply: Reply, **start: Any) -> list[int]:
        """Listener `name`, answering each invocation with `reply`; the invocation ids it
        was sent, as they come."""
        listen = self.stub.Listen()
        begin = pb.ListenStart(session_id=self.id, name=name, **start)
        await listen.write(pb.ListenRequest(start=begin))
        assert (await listen.read()).WhichOneof("kind") == "registered"
        invoked: list[int] = []

        async def answer_each() -> None:
            while (message := await listen.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "invocation":
                    invoked.append(message.invocation.invocation_id)
                if kind in ("invocation", "next_result"):
                    await listen.write(reply(message))

        task = asyncio.create_task(answer_each())
        self._listening.append((task, listen))
        return invoked

    _listening: list[tuple[asyncio.Task[None], Any]]


@contextlib.asynccontextmanager
async def session(sidecar: Sidecar, answer: Answer = silent) -> AsyncIterator[Session]:
    async with raw_channel(sidecar.address) as channel:
        opened = Session(raw_stub(channel), answer)
        opened._listening = []
        await opened.open()
        try:
            yield opened
        finally:
            for task, listen in opened._listening:
                task.cancel()
                listen.cancel()
            opened.close()


def invocation_id(message: pb.ListenResponse) -> int:
    return int(getattr(message, str(message.WhichOneof("kind"))).invocation_id)


def failing(why: str) -> Reply:
    return lambda message: pb.ListenRequest(
        failure=pb.ListenerFailure(invocation_id=invocation_id(message), message=why)
    )


def adding(name: str) -> Reply:
    """A listener that returns its assembly with section `name` added."""

    def reply(message: pb.ListenResponse) -> pb.ListenRequest:
        assembly = pb.PromptAssembly()
        assembly.CopyFrom(message.invocation.assembly)
        assembly.sections.append(pb.AssembledSection(name=name, text=f"{name} was here"))
        result = pb.ListenerResult(invocation_id=invocation_id(message), assembly=assembly)
        return pb.ListenRequest(result=result)

    return reply


def next_then_failing(why: str) -> Reply:
    """A listener that calls next() unchanged, then fails once the rest returned."""

    def reply(message: pb.ListenResponse) -> pb.ListenRequest:
        if message.WhichOneof("kind") == "next_result":
            return failing(why)(message)
        handed = pb.ListenerNext(
            invocation_id=invocation_id(message), assembly=message.invocation.assembly
        )
        return pb.ListenRequest(next=handed)

    return reply


async def assembled(stub: Stub, **request: Any) -> tuple[pb.AssembleResponse, dict[str, str]]:
    """An Assemble response and its trailers."""
    call = stub.Assemble(pb.AssembleRequest(**request), timeout=10)
    response = await call
    return response, {key: str(value) for key, value in (await call.trailing_metadata() or ())}


async def refused(stub: Stub, **request: Any) -> tuple[str, str]:
    """The reason and message an Assemble fails with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Assemble(pb.AssembleRequest(**request), timeout=10)
    trailers = dict(caught.value.trailing_metadata() or ())
    return str(trailers.get("dsh-error-reason")), str(caught.value.details())


async def ref_of(stub: Stub, name: str) -> str:
    """The public reference of the registration named `name`, from a listing."""
    async for batch in stub.ListRegistrations(pb.ListRegistrationsRequest()):
        for info in batch.registrations:
            if info.name == name:
                return info.ref
    raise AssertionError(f"{name} is not listed")


def names(response: pb.AssembleResponse) -> list[str]:
    return [section.name for section in response.assembly.sections[2:]]  # after the built-ins


async def test_an_ignored_provider_that_fails_is_left_out_and_named_in_response_and_trailer(
    sidecar: Sidecar,
) -> None:
    async with session(sidecar, by_key(cwd=error("no cwd"), rules=text("Be precise."))) as s:
        await s.section("rules", order=10)
        await s.section("cwd", failure_policy=IGNORE)
        response, trailers = await assembled(s.stub, render=True)
        ref = await ref_of(s.stub, "cwd")
    assert names(response) == ["rules"]
    assert list(response.skipped) == [
        pb.SkippedStep(
            kind=pb.CHANGE_KIND_SECTION,
            name="cwd",
            ref=ref,
            reason="PROVIDER_FAILED",
            message='section provider "cwd" (global) failed: no cwd',
        )
    ]
    assert trailers["dsh-skipped-steps"] == f"section:{ref}:PROVIDER_FAILED"
    assert response.rendered.prompt.endswith("Be precise.")
    labels = {"kind": "provider", "reason": "PROVIDER_FAILED"}
    assert metric(sidecar, "dsp_skipped_callbacks_total", **labels) == 1


async def test_an_ignored_provider_that_times_out_is_skipped_and_still_ejected(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5)
    async with session(sidecar, silent) as s:
        await s.section("slow", failure_policy=IGNORE)
        first, _ = await assembled(s.stub)
        second, trailers = await assembled(s.stub)
    assert [(step.name, step.reason) for step in first.skipped] == [("slow", "PROVIDER_TIMEOUT")]
    assert first.skipped[0].message == 'section provider "slow" (global) did not answer within 0.5s'
    assert (list(second.skipped), trailers.get("dsh-skipped-steps")) == ([], None)  # ejected
    assert metric(sidecar, "dsp_ejected_callbacks_total", kind="provider") == 1
    labels = {"kind": "provider", "reason": "PROVIDER_TIMEOUT"}
    assert metric(sidecar, "dsp_skipped_callbacks_total", **labels) == 1


async def test_a_slow_ignored_provider_does_not_hold_up_the_failing_ones_of_its_session(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(provider_timeout_s=0.5, eject_after_timeouts=0)
    async with session(sidecar, by_key(slow=silent, cwd=text("cwd: /src"))) as s:
        await s.section("cwd", order=10)
        await s.section("slow", failure_policy=IGNORE)
        response, _ = await assembled(s.stub)
    assert names(response) == ["cwd"]  # asked in an exchange of its own, answered in time
    assert [step.name for step in response.skipped] == ["slow"]


async def test_a_provider_under_fail_still_fails_the_assembly_beside_an_ignored_one(
    sidecar: Sidecar,
) -> None:
    answers = by_key(cwd=error("no cwd"), extra=error("no extra"))
    async with session(sidecar, answers) as s:
        await s.section("cwd", order=10, failure_policy=pb.FAILURE_POLICY_FAIL)
        await s.section("extra", failure_policy=IGNORE)
        failed = await refused(s.stub)
    assert failed == ("PROVIDER_FAILED", 'section provider "cwd" (global) failed: no cwd')
    assert (
        metric(sidecar, "dsp_skipped_callbacks_total", kind="provider", reason="PROVIDER_FAILED")
        == 0
    )


async def test_an_unknown_failure_policy_from_a_newer_client_is_fail(sidecar: Sidecar) -> None:
    async with session(sidecar, error("no cwd")) as s:
        await s.section("cwd", failure_policy=7)  # a value this sidecar does not know
        failed = await refused(s.stub)
    assert failed == ("PROVIDER_FAILED", 'section provider "cwd" (global) failed: no cwd')


async def test_an_ignored_variable_provider_that_fails_leaves_the_variable_without_a_value(
    sidecar: Sidecar,
) -> None:
    async with session(sidecar, by_key(who=error("nobody"), hi=text("Hi {{who}}."))) as s:
        await s.section("hi")
        await s.provider("variable", "who", failure_policy=IGNORE)
        response, _ = await assembled(s.stub)
        render = await refused(s.stub, render=True)
    assert [(v.name, v.HasField("value")) for v in response.assembly.variables] == [("who", False)]
    assert [(step.kind, step.name) for step in response.skipped] == [
        (pb.CHANGE_KIND_VARIABLE, "who")
    ]
    # strict rendering fails loudly, as for any variable without a value
    assert render == (
        "RENDER_FAILED",
        'prompt variable "{{who}}" has no value for this assembly (section "hi")',
    )


async def test_an_ignored_listener_that_fails_is_passed_over_and_later_listeners_still_run(
    sidecar: Sidecar,
) -> None:
    async with session(sidecar) as s:
        await s.listener("decorate", failing("no weather today"), failure_policy=IGNORE)
        await s.listener("sign", adding("signature"))
        response, trailers = await assembled(s.stub)
        ref = await ref_of(s.stub, "decorate")
    assert names(response) == ["signature"]
    assert [(step.kind, step.reason, step.message) for step in response.skipped] == [
        (pb.CHANGE_KIND_LISTENER, "LISTENER_FAILED", 'listener "decorate" failed: no weather today')
    ]
    assert trailers["dsh-skipped-steps"] == f"listener:{ref}:LISTENER_FAILED"
    labels = {"kind": "listener", "reason": "LISTENER_FAILED"}
    assert metric(sidecar, "dsp_skipped_callbacks_total", **labels) == 1


async def test_an_ignored_listener_that_fails_after_next_keeps_what_the_rest_returned(
    sidecar: Sidecar,
) -> None:
    async with session(sidecar) as s:
        await s.listener("post", next_then_failing("post-processing broke"), failure_policy=IGNORE)
        signed = await s.listener("sign", adding("signature"))
        response, _ = await assembled(s.stub)
    assert names(response) == ["signature"] and len(signed) == 1  # the rest ran once
    assert [step.reason for step in response.skipped] == ["LISTENER_FAILED"]


async def test_a_listener_under_fail_that_fails_still_fails_the_assembly(sidecar: Sidecar) -> None:
    async with session(sidecar) as s:
        await s.listener("guard", failing("denied"), failure_policy=pb.FAILURE_POLICY_FAIL)
        await s.listener("sign", adding("signature"))
        failed = await refused(s.stub)
    assert failed == ("LISTENER_FAILED", 'listener "guard" failed: denied')


async def test_an_assembly_with_a_skipped_step_is_not_kept_as_the_plans_response(
    sidecar: Sidecar,
) -> None:
    answers = iter([error("not yet"), text("cwd: /src")])
    cache = pb.CachePolicy(depends_on=pb.CACHE_DEPENDENCY_REVISION)
    async with session(sidecar, lambda call: next(answers)(call)) as s:
        await s.section("cwd", cache=cache, failure_policy=IGNORE)
        first, _ = await assembled(s.stub)
        second, _ = await assembled(s.stub)
        third, _ = await assembled(s.stub)
    assert (names(first), names(second), names(third)) == ([], ["cwd"], ["cwd"])
    assert s.asked == ["cwd", "cwd"]  # asked again after the skip; then its answer is reused


async def test_a_cached_listener_result_with_a_skipped_step_is_not_kept(sidecar: Sidecar) -> None:
    outcomes = iter([failing("not yet"), adding("weather")])
    cache = pb.CachePolicy(depends_on=pb.CACHE_DEPENDENCY_REVISION)
    async with session(sidecar, text("cwd: /src")) as s:
        await s.section("cwd")  # asked every time: the response is never kept, the tail is
        invoked = await s.listener(
            "weather", lambda i: next(outcomes)(i), cache=cache, failure_policy=IGNORE
        )
        first, _ = await assembled(s.stub)
        second, _ = await assembled(s.stub)
        third, _ = await assembled(s.stub)
    assert (names(first), names(second), names(third)) == (
        ["cwd"],
        ["cwd", "weather"],
        ["cwd", "weather"],
    )
    assert len(invoked) == 2  # invoked again after the skip; then its result is reused


async def test_the_report_names_the_skipped_step(sidecar: Sidecar) -> None:
    async with session(sidecar, error("no cwd")) as s:
        await s.section("cwd", failure_policy=IGNORE)
        response, _ = await assembled(s.stub, report=True)
    assert list(response.report.skipped) == list(response.skipped)
    assert [step.name for step in response.report.skipped] == ["cwd"]


async def test_skipped_steps_are_logged_once_per_callback_and_reason_in_a_while(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dsh_system_prompt")
    async with session(sidecar, error("no cwd")) as s:
        await s.section("cwd", failure_policy=IGNORE)
        for _ in range(5):
            await assembled(s.stub)
    lines = [r.getMessage() for r in caplog.records if "went on without" in r.getMessage()]
    assert lines == [
        'assembly went on without provider cwd: section provider "cwd" (global) failed: no cwd'
        " (failure_policy IGNORE)"
    ]
    labels = {"kind": "provider", "reason": "PROVIDER_FAILED"}
    assert metric(sidecar, "dsp_skipped_callbacks_total", **labels) == 5


async def test_a_skipped_tool_provider_does_not_fail_the_tool_orders_check(
    make_sidecar: SidecarFactory,
) -> None:
    sidecar = await make_sidecar(tool_order=["search", "<unlisted-tools>"])
    async with session(sidecar, error("index offline")) as s:
        await s.provider("tools", "search", failure_policy=IGNORE)
        response, _ = await assembled(s.stub)
    assert [(step.kind, step.reason) for step in response.skipped] == [
        (pb.CHANGE_KIND_TOOLS, "PROVIDER_FAILED")
    ]
    assert list(response.assembly.tools) == []


async def test_a_prefix_broken_by_a_skipped_step_says_so_in_the_report(sidecar: Sidecar) -> None:
    answers = iter([text("cwd: /src"), error("no cwd")])
    async with session(sidecar, lambda call: next(answers)(call)) as s:
        await s.section("cwd", failure_policy=IGNORE)
        await assembled(s.stub, report=True)
        broken, _ = await assembled(s.stub, report=True)
    stability = broken.report.stability
    assert stability.first_changed == 'section "cwd"'
    assert stability.reason == (
        'section "cwd" removed; this assembly skipped section "cwd" (PROVIDER_FAILED)'
    )
