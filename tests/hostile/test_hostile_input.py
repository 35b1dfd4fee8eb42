"""Property: hostile values at every RPC get a clean status and change nothing.

The sidecar runs on its own event loop in a thread, so hypothesis can drive it
from a plain (synchronous) test; every call goes over a real socket.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar, parse_config, start_sidecar
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

T = TypeVar("T")
CLEAN_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@dataclass
class Harness:
    run: Callable[[Awaitable[Any]], Any]
    sidecar: Sidecar
    stub: pb_grpc.SystemPromptServiceStub
    mine: str  # a session this test owns
    theirs: str  # another session, whose ids must stay out of reach
    their_registration: str
    their_scope: str

    def call(self, method: str, request: Any) -> Any:
        """Make one unary call on the sidecar's loop (where the channel lives)."""

        async def invoke() -> Any:
            return await getattr(self.stub, method)(request, timeout=10)

        return self.run(invoke())

    def snapshot(self) -> tuple[object, ...]:
        registry = self.sidecar.registry
        entries = [(e.id, e.owner, e.kind, e.name, e.scope) for e in registry.registrations()]
        return (registry.revision, tuple(entries), tuple(registry.scope_keys()))


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(30)  # type: ignore[arg-type]

    async def setup() -> tuple[Sidecar, grpc.aio.Channel, list[Any], Harness]:
        small = {"max_name_bytes": 64, "max_text_bytes": 4096, "max_tool_schema_bytes": 4096}
        config = {"limits": {**small, "max_message_bytes": 65536}}
        sidecar = await start_sidecar(parse_config(config), "127.0.0.1:0")
        channel = grpc.aio.insecure_channel(sidecar.address)
        stub = pb_grpc.SystemPromptServiceStub(channel)
        streams, ids = [], []
        for name in ("mine", "theirs"):
            stream = stub.OpenSession()
            await stream.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name=name)))
            ids.append((await stream.read()).opened.session_id)
            streams.append(stream)
        theirs = ids[1]
        registration = await stub.RegisterSection(
            pb.RegisterSectionRequest(session_id=theirs, name="theirs", order=1, text="t")
        )
        scope = await stub.OpenScope(pb.OpenScopeRequest(session_id=theirs, key="their-scope"))
        harness = Harness(
            run, sidecar, stub, ids[0], theirs, registration.registration_id, scope.scope_id
        )
        return sidecar, channel, streams, harness

    sidecar, channel, streams, built = run(setup())
    yield built

    async def teardown() -> None:
        for stream in streams:
            stream.cancel()
        await channel.close()
        await sidecar.server.stop(grace=None)

    run(teardown())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


names = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["", "rules", "deployment:persona", "harness:identity", "<unlisted-tools>"]),
    st.text(alphabet='é漢🙂\x00\n{}"\\', max_size=40),
)
orders = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, float("nan"), float("inf")]),
)
texts = st.one_of(st.text(max_size=200), st.just("x" * 5000), st.just("{{{model}}}"))
json_texts = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["", "[]", "null", "NaN", "{", '{"a": NaN}', '{"type": "object"}', "1"]),
)


def requests(harness: Harness) -> st.SearchStrategy[tuple[str, Any]]:
    sessions = st.one_of(st.just(harness.mine), st.just(harness.theirs), st.text(max_size=30))
    scopes = st.one_of(st.just(""), st.just(harness.their_scope), st.text(max_size=30))
    ids = st.one_of(st.just(harness.their_registration), st.text(max_size=30))
    placed = {"session_id": sessions, "scope_id": scopes, "name": names}  # every registration's
    section = st.builds(
        pb.RegisterSectionRequest, **placed, order=orders, complete=st.booleans(), text=texts
    )
    context = st.builds(pb.RegisterContextRequest, **placed, order=orders, text=texts)
    variable = st.builds(pb.RegisterVariableRequest, **placed, value=texts)
    tool = st.builds(pb.ToolSchema, name=names, description=texts, parameters_json=json_texts)
    tools = st.builds(
        lambda session, scope, schemas: pb.RegisterToolsRequest(
            session_id=session, scope_id=scope, result=pb.ToolProviderResult(schemas=schemas)
        ),
        sessions,
        scopes,
        st.lists(tool, max_size=3),
    )
    scope = st.builds(
        pb.OpenScopeRequest,
        session_id=sessions,
        key=names,
        parent_key=st.one_of(names, st.just("their-scope")),
    )
    # A session id is the session's credential: only ever dispose as "mine" or a stranger.
    strangers = st.one_of(st.just(harness.mine), st.text(max_size=30))
    dispose = st.builds(pb.DisposeRequest, session_id=strangers, registration_id=ids)
    suppress = st.builds(pb.SuppressRuntimeContextRequest, session_id=sessions, scope_id=scopes)
    assemble = st.builds(
        lambda scope_key, fields: pb.AssembleRequest(
            context=pb.AssembleContext(scope=scope_key, fields_json=fields), render=True
        ),
        names,
        json_texts,
    )
    return st.one_of(
        st.tuples(st.just("RegisterSection"), section),
        st.tuples(st.just("RegisterContext"), context),
        st.tuples(st.just("RegisterVariable"), variable),
        st.tuples(st.just("RegisterTools"), tools),
        st.tuples(st.just("OpenScope"), scope),
        st.tuples(st.just("Dispose"), dispose),
        st.tuples(st.just("SuppressRuntimeContext"), suppress),
        st.tuples(st.just("Assemble"), assemble),
    )


def test_hostile_calls_get_a_clean_status_and_leave_the_registry_as_it_was(
    harness: Harness,
) -> None:
    seen: set[object] = set()

    mine = harness.mine
    duplicate = pb.RegisterSectionRequest(
        session_id=mine, name="harness:identity", order=1, text="again"
    )
    unknown_session = pb.RegisterVariableRequest(session_id="nobody", name="x", value="v")

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(call=requests(harness))
    @example(call=("RegisterSection", duplicate))  # ALREADY_EXISTS
    @example(
        call=(
            "RegisterSection",
            pb.RegisterSectionRequest(session_id=mine, name="fine", order=1, text="accepted"),
        )
    )
    @example(call=("RegisterVariable", unknown_session))  # FAILED_PRECONDITION
    @example(call=("Dispose", pb.DisposeRequest(session_id=mine, registration_id="x")))
    @example(
        call=(
            "RegisterSection",
            pb.RegisterSectionRequest(session_id=mine, name="n", order=float("nan")),
        )
    )
    def check(call: tuple[str, Any]) -> None:
        method, request = call
        before = harness.snapshot()
        try:
            reply = harness.call(method, request)
        except grpc.aio.AioRpcError as error:
            seen.add(error.code())
            assert error.code() in CLEAN_CODES, (method, request, error.code(), error.details())
            assert error.details(), "every refusal says what is wrong"
            assert harness.snapshot() == before, "a rejected call changed the registry"
        else:
            seen.add(method)
            registered = getattr(reply, "registration_id", "") or getattr(reply, "scope_id", "")
            if registered:  # accepted: undo it so every example starts from the same state
                undo = pb.DisposeRequest(session_id=request.session_id, registration_id=registered)
                harness.call("Dispose", undo)
        assert harness.call("Assemble", pb.AssembleRequest()).assembly  # still serving

    check()
    assert seen >= CLEAN_CODES - {grpc.StatusCode.RESOURCE_EXHAUSTED}  # the rejections were tried
    assert seen >= {"RegisterSection", "Assemble"}  # and so were accepted calls
    their_entries = harness.sidecar.registry.registrations(owner=harness.theirs)
    assert {entry.id for entry in their_entries} >= {harness.their_registration}
