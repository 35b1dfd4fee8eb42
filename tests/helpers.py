"""Small helpers the tests share (imported as `helpers`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import math
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.rpc.streams.listeners import ListenerStream

SidecarFactory = Callable[..., Awaitable[Sidecar]]


async def credentialed(
    make: SidecarFactory,
    folder: Path,
    tokens: dict[str, str],
    credentials: list[dict[str, Any]],
    **config: Any,
) -> Sidecar:
    """A sidecar whose admin token is `tokens["admin"]` and whose `credentials` read theirs,
    `tokens[name]`, from files written in `folder`."""
    files = {}
    for name, token in tokens.items():
        files[name] = folder / f"{name}.token"
        files[name].write_text(token + "\n")
    listed = [{**entry, "token_file": str(files[entry["name"]])} for entry in credentials]
    return await make(auth_token_file=str(files["admin"]), credentials=listed, **config)


ClientFactory = Callable[..., Awaitable[dsp.Client]]
ClientOf = Callable[..., contextlib.AbstractAsyncContextManager[dsp.Client]]
Check = Callable[[], bool | Awaitable[bool]]

IDENTITY = "You are an AI agent powered by DeepSeek Harness."


def metric(sidecar: Sidecar, name: str, **labels: str) -> float:
    """A sample of the sidecar's own metrics; 0 while it has never been counted."""
    return sidecar.metrics.registry.get_sample_value(name, labels) or 0.0


def listener_streams(sidecar: Sidecar) -> list[ListenerStream]:
    """The streams of the listeners the (in-process) sidecar has registered."""
    values = [entry.value for entry in sidecar.registry.registrations()]
    return [value for value in values if isinstance(value, ListenerStream)]


async def marking(assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Any) -> object:
    """A listener that adds section "mark" and hands the assembly on."""
    assembly.sections.append(dsp.AssembledSection("mark", "seen"))
    return await next_()


def section_names(assembly: dsp.PromptAssembly) -> list[str]:
    return [section.name for section in assembly.sections]


def context_names(assembly: dsp.PromptAssembly) -> list[str]:
    return [context.name for context in assembly.contexts]


def tool_names(assembly: dsp.PromptAssembly) -> list[str]:
    return [tool.name for tool in assembly.tools]


def tool(name: str, description: str = "") -> dsp.ToolSchema:
    return dsp.ToolSchema(name, description or f"the {name} tool", {"type": "object"})


async def polled(check: Check, timeout: float = 5.0, interval: float = 0.02) -> object:
    """Poll `check` (plain or async) until it is true or `timeout` passes; its last answer.

    `timeout` bounds the whole wait, a check that hangs included.
    """
    last: object = None
    try:
        async with asyncio.timeout(timeout) as bound:
            while True:
                last = check()
                if inspect.isawaitable(last):
                    last = await last
                if last:
                    return last
                await asyncio.sleep(interval)
    except TimeoutError:
        if not bound.expired():
            raise  # the check's own timeout, not ours
    return last


async def eventually(check: Check, what: str, timeout: float = 5.0, interval: float = 0.02) -> None:
    """Poll `check` (plain or async) until it is true; fail saying `what` never came."""
    last = await polled(check, timeout, interval)
    if not last:
        pytest.fail(f"{what}: still not so after {timeout:g}s (last check gave {last!r})")


async def report_of(
    client: dsp.Client,
    scope: str | None = None,
    *,
    layout: dsp.PrefixLayout | None = None,
    key: str | None = None,
    **fields: object,
) -> dsp.AssemblyReport:
    """The prompt-cache report on `client`'s assembly of `scope` with `fields` (its report
    key `key`, its prefix layout `layout`)."""
    assembly = await client.assemble(
        scope, fields, report=True, report_key=key, prefix_layout=layout
    )
    assert assembly.report is not None
    return assembly.report


# -- sessions and change events -------------------------------------------------------


async def untouched(
    assembly: dsp.PromptAssembly, context: dsp.AssembleContext, next_: object
) -> dsp.PromptAssembly:
    """A listener that hands the assembly back as it came."""
    return assembly


# The kind of each registration `one_of_each` makes, in its order, as change events name it.
ONE_OF_EACH_KINDS = ("section", "context", "tools", "variable", "suppressor", "listener")


async def one_of_each(client: dsp.Client, scope: dsp.Client | dsp.Scope) -> list[dsp.Disposer]:
    """One registration of each kind, in this order: section "rules", context "cwd", a
    tool provider, variable "model", the runtime-context suppressor (through `scope`) and
    the listener `untouched`; their disposers."""
    return [
        await client.section("rules", 1, "r"),
        await client.context("cwd", 1, "c"),
        await client.tools([tool("bash")]),
        await client.variable("model", "m"),
        await scope.suppress_runtime_context(),
        await client.on_assemble(untouched),
    ]


BUILTIN_SECTIONS = ("harness:identity", dsp.PERSONA_SECTION)


async def next_events(
    stream: dsp.ChangeStream, count: int, timeout: float = 5.0
) -> list[dsp.ChangeEvent]:
    """The next `count` change events (a ChangesMissed fails the test)."""
    events: list[dsp.ChangeEvent] = []
    while len(events) < count:
        item = await asyncio.wait_for(anext(stream), timeout)
        assert isinstance(item, dsp.ChangeEvent), f"unexpected {item!r}"
        events.append(item)
    return events


async def chain(client: dsp.Client) -> tuple[dsp.Scope, dsp.Scope, dsp.Scope]:
    """Scopes "org", "team" under it and "worker" under that."""
    org = await client.scope("org")
    team = await client.scope("team", parent="org")
    return org, team, await client.scope("worker", parent="team")


async def scope_tree(client: dsp.Client) -> tuple[dsp.Scope, dsp.Scope, dsp.Scope]:
    """Scopes "team", "agent-1" under it, and "agent-2" beside them."""
    team = await client.scope("team")
    return team, await client.scope("agent-1", parent="team"), await client.scope("agent-2")


def raw_channel(address: str) -> grpc.aio.Channel:
    """A plain channel for calling the wire contract directly."""
    return grpc.aio.insecure_channel(address)


def raw_stub(channel: grpc.aio.Channel) -> pb_grpc.SystemPromptServiceStub:
    return pb_grpc.SystemPromptServiceStub(channel)


def context(name: str, text: str) -> dsp.AssembledContext:
    return dsp.AssembledContext(name, text)


def section(name: str, text: str) -> dsp.AssembledSection:
    return dsp.AssembledSection(name, text)


async def rejection(
    awaitable: Awaitable[object], within: float | None = None
) -> dsp.SystemPromptError:
    """The SystemPromptError `awaitable` fails with (the test fails if it succeeds, or if
    it is still running after `within` seconds when that is given)."""
    with pytest.raises(dsp.SystemPromptError) as caught:
        async with asyncio.timeout(within):
            await awaitable
    return caught.value


# The status code the contract gives each reason (spec: contract.md), for `refusal`.
REASON_CODES = {
    "DUPLICATE_NAME": grpc.StatusCode.ALREADY_EXISTS,
    "INVALID_JSON": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_NAME": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_ORDER": grpc.StatusCode.INVALID_ARGUMENT,
    "INVALID_VARIABLE_NAME": grpc.StatusCode.INVALID_ARGUMENT,
    "INVARIANT_VIOLATION": grpc.StatusCode.FAILED_PRECONDITION,
    "MULTIPLE_COMPLETE_SECTIONS": grpc.StatusCode.FAILED_PRECONDITION,
    "NOT_UPDATABLE": grpc.StatusCode.FAILED_PRECONDITION,
    "RENDER_FAILED": grpc.StatusCode.FAILED_PRECONDITION,
    "RESERVED_TOOL_NAME": grpc.StatusCode.FAILED_PRECONDITION,
    "UNKNOWN_TOOL_ORDER_NAME": grpc.StatusCode.FAILED_PRECONDITION,
}


def refusal(reason: str, message: str) -> tuple[grpc.StatusCode, str, str]:
    """The whole failure `failure` gives for `reason` with `message`, under the contract's
    status code for that reason."""
    return REASON_CODES[reason], reason, message


def failure(error: dsp.SystemPromptError) -> tuple[grpc.StatusCode, str, str]:
    """(code, reason, message): compare a whole failure in one assertion."""
    return error.code, error.reason, error.message


NON_FINITE = [
    pytest.param(math.nan, id="nan"),
    pytest.param(math.inf, id="inf"),
    pytest.param(-math.inf, id="-inf"),
]


# The two kinds of text part: sections and runtime contexts share their naming and order rules.
TextKind = Literal["section", "context"]


def registered(assembly: dsp.PromptAssembly, kind: TextKind) -> list[tuple[str, str]]:
    """(name, text) of each part of `kind` that `assembly` lists, the built-in sections
    left out."""
    parts = assembly.sections if kind == "section" else assembly.contexts
    return [(part.name, part.text) for part in parts if part.name not in BUILTIN_SECTIONS]


async def added(client: dsp.Client, kind: TextKind, *parts: tuple[str, float]) -> list[str]:
    """Register `parts` (name, order) of `kind` in turn; the names the assembly then
    lists of that kind, the built-in sections left out."""
    for name, order in parts:
        await getattr(client, kind)(name, order, f"{name} text")
    return [name for name, _text in registered(await client.assemble(), kind)]


async def traced_growth(work: Callable[[], Awaitable[object]]) -> int:
    """Bytes of Python memory still allocated (in this process: the in-process sidecar's
    caches and buffers) once `work` is done, as tracemalloc counts them."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await work()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def garbage_left(work: Callable[[], Awaitable[object]]) -> list[object]:
    """What `work` left in reference cycles, for the garbage collector alone to free (in
    this process: the in-process sidecar's too), as gc.DEBUG_SAVEALL keeps it."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await work()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@dataclass
class RawListener:
    """A listener written straight on the stubs, as another language would."""

    stub: pb_grpc.SystemPromptServiceStub
    stream: grpc.aio.StreamStreamCall  # type: ignore[type-arg]
    registered: pb.ListenerRegistered

    async def invocation(self) -> pb.ListenerInvocation:
        """The next invocation (a failed one's cancel before it is skipped)."""
        while (message := await self.stream.read()).WhichOneof("kind") != "invocation":
            assert message.WhichOneof("kind") == "cancel", message
        return message.invocation

    async def send(self, **reply: object) -> None:
        await self.stream.write(pb.ListenRequest(**reply))  # type: ignore[arg-type]

    async def invoked_by(
        self, client: dsp.Client
    ) -> tuple[asyncio.Future[dsp.PromptAssembly], pb.ListenerInvocation]:
        """`client`'s assembly under way, and this listener's invocation for it."""
        assembling = asyncio.ensure_future(client.assemble(timeout=5))
        return assembling, await self.invocation()

    async def reply(self, invocation: pb.ListenerInvocation, **result: Any) -> None:
        """Answer `invocation` with a ListenerResult of the fields `result`."""
        await self.send(result=pb.ListenerResult(invocation_id=invocation.invocation_id, **result))

    async def call_next(
        self, invocation: pb.ListenerInvocation, tool_slots: list[int]
    ) -> pb.ListenerNextResult:
        """Call next() with the invocation's sections and `tool_slots`; what it returned."""
        assembly = pb.PromptAssembly(sections=invocation.assembly.sections)
        next_ = pb.ListenerNext(
            invocation_id=invocation.invocation_id, assembly=assembly, tool_slots=tool_slots
        )
        await self.send(next=next_)
        return (await self.stream.read()).next_result


@asynccontextmanager
async def raw_listener(sidecar: Sidecar, *features: str) -> AsyncIterator[RawListener]:
    async with raw_channel(sidecar.address) as channel:
        stub = raw_stub(channel)
        session = stub.OpenSession()
        await session.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="raw")))
        session_id = (await session.read()).opened.session_id
        stream = stub.Listen()
        start = pb.ListenStart(session_id=session_id, name="raw", features=list(features))
        await stream.write(pb.ListenRequest(start=start))
        registered = (await stream.read()).registered
        try:
            yield RawListener(stub, stream, registered)
        finally:
            stream.cancel()
            session.cancel()
