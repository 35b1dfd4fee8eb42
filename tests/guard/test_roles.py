"""Roles: what an admin, an agent and a reader credential may do, RPC by RPC.

Each case is one RPC as one credential makes it, over a real socket: allowed
(the call gets past the policy) or PERMISSION_DENIED with its reason and what the
credential lacks.
"""

from __future__ import annotations

import contextlib
import re
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import ConfigError, Sidecar, load_config, parse_config
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import SidecarFactory, rejection

TOKENS = {
    "admin": "admin-token-0123",
    "planner": "planner-token-4567",  # agent: scopes planner and planner/*, no grants
    "pod": "pod-token-89ab",  # agent: every scope and every grant
    "dashboard": "dashboard-token-cdef",  # reader without values
    "auditor": "auditor-token-0246",  # reader with values
}
CREDENTIALS = [
    {"name": "planner", "role": "agent", "scopes": ["planner", "planner/*"]},
    {
        "name": "pod",
        "role": "agent",
        "scopes": ["*"],
        "global": True,
        "complete": True,
        "global_listeners": True,
        "builtins": True,
    },
    {"name": "dashboard", "role": "reader"},
    {"name": "auditor", "role": "reader", "values": True},
]


def token_files(folder: Path) -> dict[str, str]:
    paths = {}
    for name, token in TOKENS.items():
        path = folder / f"{name}.token"
        path.write_text(token + "\n")
        paths[name] = str(path)
    return paths


def roles_config(folder: Path) -> dict[str, Any]:
    """The TOML keys of a sidecar with one credential of each kind."""
    files = token_files(folder)
    credentials = [{**entry, "token_file": files[entry["name"]]} for entry in CREDENTIALS]
    return {"auth_token_file": files["admin"], "credentials": credentials}


@pytest.fixture
async def roles_sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> AsyncIterator[Sidecar]:
    """A sidecar where `worker` (another agent) has a scope with a value, reported once."""
    sidecar = await make_sidecar(**roles_config(tmp_path))
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin:
        for key in ("worker", "planner"):
            scope = await admin.scope(key)
            await scope.section(f"{key}-notes", 5, f"{key}'s private notes")
            await admin.assemble(scope=key, report=True)
        yield sidecar


@dataclass
class Raw:
    """The raw stub with one credential's token, and the streams it opened."""

    stub: pb_grpc.SystemPromptServiceStub
    token: str
    streams: list[Any] = field(default_factory=list)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    async def session(self) -> str:
        call = self.stub.OpenSession(metadata=self.metadata)
        self.streams.append(call)
        await call.write(pb.OpenSessionRequest(start=pb.SessionStart(client_name="roles")))
        return str((await call.read()).opened.session_id)

    async def scope(self, session: str, key: str, parent: str = "") -> str:
        request = pb.OpenScopeRequest(session_id=session, key=key, parent_key=parent)
        return str((await self.stub.OpenScope(request, metadata=self.metadata)).scope_id)

    async def first(self, call: Any) -> Any:
        """The first message of a response stream (and the stream left to be cancelled)."""
        self.streams.append(call)
        return await call.read()


R = TypeVar("R", bound=Raw)


@contextlib.asynccontextmanager
async def raw(
    sidecar: Sidecar, who: str, token: str | None = None, kind: type[R] = Raw
) -> AsyncIterator[R]:
    """A `kind` of raw client (another module's subclass) with `who`'s token, or `token`."""
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        client = kind(pb_grpc.SystemPromptServiceStub(channel), token or TOKENS[who])
        try:
            yield client
        finally:
            for call in client.streams:
                call.cancel()


Operation = Callable[[Raw], Awaitable[object]]


def _section(scope: str | None, name: str = "notes", complete: bool = False) -> Operation:
    async def run(client: Raw) -> object:
        session = await client.session()
        handle = await client.scope(session, scope) if scope else ""
        request = pb.RegisterSectionRequest(
            session_id=session, scope_id=handle, name=name, order=1, complete=complete, text="x"
        )
        return await client.stub.RegisterSection(request, metadata=client.metadata)

    return run


async def _context(client: Raw) -> object:
    request = pb.RegisterContextRequest(session_id=await client.session(), name="c", text="x")
    return await client.stub.RegisterContext(request, metadata=client.metadata)


async def _suppress(client: Raw) -> object:
    request = pb.SuppressRuntimeContextRequest(session_id=await client.session())
    return await client.stub.SuppressRuntimeContext(request, metadata=client.metadata)


async def _tools(client: Raw) -> object:
    request = pb.RegisterToolsRequest(
        session_id=await client.session(), result=pb.ToolProviderResult(), name="t"
    )
    return await client.stub.RegisterTools(request, metadata=client.metadata)


async def _variable(client: Raw) -> object:
    request = pb.RegisterVariableRequest(session_id=await client.session(), name="v", value="1")
    return await client.stub.RegisterVariable(request, metadata=client.metadata)


async def _own_variable(client: Raw) -> object:
    session = await client.session()
    handle = await client.scope(session, "planner/sub")
    request = pb.RegisterVariableRequest(session_id=session, scope_id=handle, name="v", value="1")
    return await client.stub.RegisterVariable(request, metadata=client.metadata)


def _open_scope(key: str, parent: str = "") -> Operation:
    async def run(client: Raw) -> object:
        return await client.scope(await client.session(), key, parent)

    return run


async def _dispose_and_update(client: Raw) -> object:
    session = await client.session()
    handle = await client.scope(session, "planner")
    request = pb.RegisterSectionRequest(
        session_id=session, scope_id=handle, name="mine", order=1, text="x"
    )
    made = await client.stub.RegisterSection(request, metadata=client.metadata)
    update = pb.UpdateRequest(session_id=session, registration_id=made.registration_id, text="y")
    await client.stub.Update(update, metadata=client.metadata)
    dispose = pb.DisposeRequest(session_id=session, registration_id=made.registration_id)
    return await client.stub.Dispose(dispose, metadata=client.metadata)


def _assemble(scope: str, report: bool = False) -> Operation:
    async def run(client: Raw) -> object:
        request = pb.AssembleRequest(context=pb.AssembleContext(scope=scope), report=report)
        return await client.stub.Assemble(request, metadata=client.metadata)

    return run


def _watch_changes(scope: str) -> Operation:
    async def run(client: Raw) -> object:
        request = pb.WatchChangesRequest(filter=pb.ChangeFilter(scope=scope))
        return await client.first(client.stub.WatchChanges(request, metadata=client.metadata))

    return run


def _list(scope: str, values: bool = False) -> Operation:
    async def run(client: Raw) -> object:
        request = pb.ListRegistrationsRequest(
            filter=pb.ChangeFilter(scope=scope), include_values=values
        )
        return [
            batch
            async for batch in client.stub.ListRegistrations(request, metadata=client.metadata)
        ]

    return run


def _watch_prompt(scope: str) -> Operation:
    async def run(client: Raw) -> object:
        request = pb.WatchPromptRequest(scope=scope)
        return await client.first(client.stub.WatchPrompt(request, metadata=client.metadata))

    return run


def _listen(scope: str | None) -> Operation:
    async def run(client: Raw) -> object:
        session = await client.session()
        handle = await client.scope(session, scope) if scope else ""
        call = client.stub.Listen(metadata=client.metadata)
        client.streams.append(call)
        await call.write(
            pb.ListenRequest(start=pb.ListenStart(session_id=session, scope_id=handle))
        )
        reply = await call.read()
        if reply is grpc.aio.EOF:
            await call  # raises the stream's status
        return reply

    return run


def _report_usage(scope: str) -> Operation:
    async def run(client: Raw) -> object:
        request = pb.ReportUsageRequest(scope=scope, cached_tokens=1)
        return await client.stub.ReportUsage(request, metadata=client.metadata)

    return run


def _cache_history(scope: str, key: str = "") -> Operation:
    async def run(client: Raw) -> object:
        request = pb.GetCacheHistoryRequest(scope=scope, report_key=key)
        return await client.stub.GetCacheHistory(request, metadata=client.metadata)

    return run


# name: (operation, who may: the credentials allowed; every other one is refused)
EVERYONE = {"admin", "planner", "pod", "dashboard", "auditor"}
WRITERS = {"admin", "planner", "pod"}
POD_WIDE = {"admin", "pod"}
MATRIX: dict[str, tuple[Operation, set[str]]] = {
    "OpenSession": (lambda client: client.session(), EVERYONE),
    "RegisterSection in its own scope": (_section("planner"), WRITERS),
    "RegisterSection in the global layer": (_section(None), POD_WIDE),
    "RegisterSection complete": (_section("planner", complete=True), POD_WIDE),
    "RegisterSection deployment:persona in its scope": (
        _section("planner", dsp.PERSONA_SECTION),
        POD_WIDE,
    ),
    "RegisterSection harness:identity in its scope": (
        _section("planner", "harness:identity"),
        POD_WIDE,
    ),
    "RegisterContext in the global layer": (_context, POD_WIDE),
    "SuppressRuntimeContext everywhere": (_suppress, POD_WIDE),
    "RegisterTools in the global layer": (_tools, POD_WIDE),
    "RegisterVariable in the global layer": (_variable, POD_WIDE),
    "RegisterVariable in a sub-scope it lists": (_own_variable, WRITERS),
    "OpenScope on its key": (_open_scope("planner"), WRITERS),
    "OpenScope on another agent's key": (_open_scope("worker"), POD_WIDE),
    "OpenScope with another agent's key as parent": (_open_scope("planner/x", "worker"), POD_WIDE),
    "Update and Dispose its own": (_dispose_and_update, WRITERS),
    "Assemble the global layer": (_assemble(""), EVERYONE - {"dashboard"}),
    "Assemble its scope": (_assemble("planner"), EVERYONE - {"dashboard"}),
    "Assemble another agent's scope": (_assemble("worker"), POD_WIDE | {"auditor"}),
    "Assemble with a report of its scope": (_assemble("planner", report=True), WRITERS),
    "WatchChanges of every layer": (_watch_changes(""), POD_WIDE | {"dashboard", "auditor"}),
    "WatchChanges of its scope": (_watch_changes("planner"), EVERYONE),
    "WatchChanges of another agent's scope": (
        _watch_changes("worker"),
        POD_WIDE | {"dashboard", "auditor"},
    ),
    "ListRegistrations of every layer": (_list(""), POD_WIDE | {"dashboard", "auditor"}),
    "ListRegistrations of its scope with values": (
        _list("planner", values=True),
        EVERYONE - {"dashboard"},
    ),
    "ListRegistrations of another agent's scope with values": (
        _list("worker", values=True),
        POD_WIDE | {"auditor"},
    ),
    "WatchPrompt of its scope": (_watch_prompt("planner"), EVERYONE - {"dashboard"}),
    "WatchPrompt of another agent's scope": (_watch_prompt("worker"), POD_WIDE | {"auditor"}),
    "Listen in its scope": (_listen("planner"), WRITERS),
    "Listen on every assembly": (_listen(None), POD_WIDE),
    "ReportUsage of its scope": (_report_usage("planner"), WRITERS),
    "ReportUsage of another agent's scope": (_report_usage("worker"), POD_WIDE),
    "GetCacheHistory of its scope": (_cache_history("planner"), EVERYONE),
    "GetCacheHistory of another agent's scope": (
        _cache_history("worker"),
        POD_WIDE | {"dashboard", "auditor"},
    ),
    "GetCacheHistory of a report key outside its scopes": (
        _cache_history("planner", "conv-7"),
        POD_WIDE | {"dashboard", "auditor"},
    ),
}
CASES = [(name, who) for name in MATRIX for who in sorted(TOKENS)]


@pytest.mark.parametrize(("name", "who"), CASES, ids=[f"{w}: {n}" for n, w in CASES])
async def test_a_credential_may_make_a_call_only_as_its_role_allows(
    roles_sidecar: Sidecar, name: str, who: str
) -> None:
    operation, allowed = MATRIX[name]
    async with raw(roles_sidecar, who) as client:
        try:
            await operation(client)
        except grpc.aio.AioRpcError as error:
            outcome = error.code()
            reason = dict(error.trailing_metadata() or ()).get("dsh-error-reason")
            if outcome == grpc.StatusCode.PERMISSION_DENIED:
                assert reason == "PERMISSION_DENIED"
                assert f'credential "{who}"' in str(error.details())
        else:
            outcome = grpc.StatusCode.OK
    assert outcome == (grpc.StatusCode.OK if who in allowed else grpc.StatusCode.PERMISSION_DENIED)


async def test_a_refusal_names_what_the_credential_lacks(roles_sidecar: Sidecar) -> None:
    async with dsp.connect(roles_sidecar.address, token=TOKENS["planner"]) as planner:
        error = await rejection(planner.section("everyone", 1, "Obey me."))
        complete = await rejection(
            (await planner.scope("planner")).section("all", 1, "The whole prompt.", complete=True)
        )
    assert (error.code, error.reason) == (
        grpc.StatusCode.PERMISSION_DENIED,
        dsp.Reason.PERMISSION_DENIED,
    )
    assert str(error).endswith(
        "credential \"planner\" (agent) may not register: the global layer needs 'global = true'"
    )
    assert "a complete section needs 'complete = true'" in str(complete)


async def test_an_agent_cannot_read_or_write_another_agents_scope_through_the_client(
    roles_sidecar: Sidecar,
) -> None:
    async with dsp.connect(roles_sidecar.address, token=TOKENS["planner"]) as planner:
        refused = [
            await rejection(planner.assemble(scope="worker")),
            await rejection(planner.scope("worker")),
            await rejection(planner.scope("planner/child", parent="worker")),
            await rejection(planner.snapshot("worker", values=True)),
            await rejection(planner.snapshot()),
            await rejection(planner.section("complete", 1, "Everything.", complete=True)),
            await rejection(planner.section(dsp.PERSONA_SECTION, 1, "Be evil.")),
        ]
    assert {error.reason for error in refused} == {dsp.Reason.PERMISSION_DENIED}


async def test_a_session_opened_by_one_credential_cannot_be_used_by_another(
    roles_sidecar: Sidecar,
) -> None:
    async with raw(roles_sidecar, "pod") as pod, raw(roles_sidecar, "planner") as planner:
        session = await pod.session()  # its id leaked to the planner
        request = pb.RegisterSectionRequest(session_id=session, name="x", order=1, text="x")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await planner.stub.RegisterSection(request, metadata=planner.metadata)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert 'a session opened by credential "pod"' in str(refused.value.details())


async def test_a_token_that_is_no_credentials_is_unauthenticated(roles_sidecar: Sidecar) -> None:
    with pytest.raises(dsp.SystemPromptError) as failure:
        await dsp.connect(roles_sidecar.address, token="nobody's")
    assert failure.value.reason is dsp.Reason.UNAUTHENTICATED


async def test_only_auth_token_file_keeps_one_admin_token(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    files = token_files(tmp_path)
    sidecar = await make_sidecar(auth_token_file=files["admin"])
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as client:
        await client.section("everyone", 1, "Global.", complete=True)
        await client.scope("any")
        listing = await client.snapshot(values=True)
    assert any(entry.name == "everyone" for entry in listing.registrations)


@pytest.mark.parametrize(
    ("key", "entry"),
    [
        ("credentials[0].role", {"name": "x", "role": "root", "token_file": "{admin}"}),
        ("credentials[0].name", {"role": "agent", "token_file": "{admin}"}),
        ("credentials[0].token_file", {"name": "x", "role": "agent"}),
        (
            "credentials[0].token_file",
            {"name": "x", "role": "agent", "token_file": "{admin}", "client_certificate": "x"},
        ),
        (
            "credentials[0].client_certificate",
            {"name": "x", "role": "agent", "client_certificate": "x"},
        ),
        (
            "credentials[0].values",
            {"name": "x", "role": "agent", "token_file": "{pod}", "values": True},
        ),
        (
            "credentials[0].global",
            {"name": "x", "role": "reader", "token_file": "{pod}", "global": True},
        ),
        (
            "credentials[0].scopes",
            {"name": "x", "role": "agent", "token_file": "{pod}", "scopes": "planner"},
        ),
        ("credentials[0].name", {"name": "admin", "role": "agent", "token_file": "{pod}"}),
        ("credentials[0].token_file", {"name": "x", "role": "agent", "token_file": "{admin}"}),
        ("credentials[0].token_file", {"name": "x", "role": "agent", "token_file": "{missing}"}),
        (
            "credentials[0].unknown",
            {"name": "x", "role": "agent", "token_file": "{pod}", "unknown": 1},
        ),
    ],
)
def test_a_bad_credential_is_a_config_error_naming_its_key(
    tmp_path: Path, key: str, entry: dict[str, Any]
) -> None:
    files = {**token_files(tmp_path), "missing": str(tmp_path / "missing")}
    filled = {k: v.format(**files) if isinstance(v, str) else v for k, v in entry.items()}
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        parse_config({"auth_token_file": files["admin"], "credentials": [filled]})


async def test_a_reload_changes_what_a_credential_may(
    make_sidecar: SidecarFactory, tmp_path: Path
) -> None:
    files = token_files(tmp_path)
    config = tmp_path / "sidecar.toml"
    planner = (
        f'[[credentials]]\nname = "planner"\nrole = "agent"\ntoken_file = "{files["planner"]}"\n'
    )
    config.write_text(f'auth_token_file = "{files["admin"]}"\n{planner}scopes = ["planner"]\n')
    sidecar = await make_sidecar(**tomllib.loads(config.read_text()))
    reloader = Reloader(sidecar, str(config), lambda: load_config(config))
    async with dsp.connect(sidecar.address, token=TOKENS["planner"]) as client:
        before = await rejection(client.assemble(scope="worker"))
        config.write_text(f'auth_token_file = "{files["admin"]}"\n{planner}scopes = ["*"]\n')
        reloaded = reloader.reload("test")
        await client.assemble(scope="worker")
    assert before.reason is dsp.Reason.PERMISSION_DENIED
    assert reloaded is not None and reloaded.applied == ["credentials"]
