"""Revocation is immediate (issue 34, item 2): a config reload that removes or narrows a
credential decides every open stream again (sessions, listeners, change watches, prompt
watches, listings), ends those no longer allowed with UNAUTHENTICATED or
PERMISSION_DENIED, and disposes a session so ended as a dead peer's, with its change
events. A narrowed credential loses only what it lost; another credential loses nothing.

Every stream here is written straight on the stubs, so each one's own status is seen
(a client library would reconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt_server import Sidecar, load_config, start_sidecar
from dsh_system_prompt_server.sidecar.reload import Reloader
from helpers import section_names

from guard.test_roles import Raw, raw

TOKENS = {
    "admin": "revoke-admin-token-0123",
    "agent": "revoke-agent-token-4567",
    "reader": "revoke-reader-token-89ab",
    "bystander": "revoke-bystander-token-cdef",
}
END_WAIT_S = 10  # a stream left open fails the test in this time, not at the suite's timeout


def credentials(
    agent: list[str] | None, reader: list[str] | None, reader_values: bool = True
) -> str:
    """The config's credentials: the agent and the reader with these scopes (None: removed),
    the reader granted values unless told, and a bystander agent that is never touched."""
    lines = ['auth_token_file = "admin.token"']
    entries = [("agent", "agent", agent), ("reader", "reader", reader)]
    entries.append(("bystander", "agent", ["bystander"]))
    for name, role, scopes in entries:
        if scopes is None:
            continue
        listed = ", ".join(f'"{scope}"' for scope in scopes)
        lines += ["[[credentials]]", f'name = "{name}"', f'role = "{role}"']
        lines += [f'token_file = "{name}.token"', f"scopes = [{listed}]"]
        lines += ["values = true"] if role == "reader" and reader_values else []
    return "\n".join(lines) + "\n"


@dataclass
class Revocable:
    sidecar: Sidecar
    config: Path
    reloader: Reloader

    def reload(
        self, agent: list[str] | None, reader: list[str] | None, reader_values: bool = True
    ) -> None:
        self.config.write_text(credentials(agent, reader, reader_values))
        reloaded = self.reloader.reload("test")
        assert reloaded is not None and reloaded.applied == ["credentials"]


@pytest.fixture
async def revocable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Revocable]:
    monkeypatch.chdir(tmp_path)  # the config's token files are relative to it
    for name, token in TOKENS.items():
        (tmp_path / f"{name}.token").write_text(token + "\n")
    config = tmp_path / "sidecar.toml"
    config.write_text(credentials(["agent", "shared"], ["*"]))
    sidecar = await start_sidecar(load_config(config), "127.0.0.1:0")
    try:
        yield Revocable(
            sidecar, config, Reloader(sidecar, str(config), lambda: load_config(config))
        )
    finally:
        await sidecar.server.stop(grace=None)


class Peer(Raw):
    """One credential's raw stub, and the streams it opened (cancelled at the end)."""

    def opened(self, call: Any) -> Any:
        self.streams.append(call)
        return call

    async def opened_session(self) -> tuple[Any, str]:
        """A session: its stream, and its id."""
        session_id = await self.session()
        return self.streams[-1], session_id

    async def section(self, session: str, handle: str, name: str) -> str:
        request = pb.RegisterSectionRequest(
            session_id=session, scope_id=handle, name=name, order=1, text=f"{name}'s text"
        )
        made = await self.stub.RegisterSection(request, metadata=self.metadata)
        return str(made.registration_id)

    async def listen(self, session: str, handle: str, name: str) -> Any:
        call = self.opened(self.stub.Listen(metadata=self.metadata))
        start = pb.ListenStart(session_id=session, scope_id=handle, name=name)
        await call.write(pb.ListenRequest(start=start))
        assert (await call.read()).WhichOneof("kind") == "registered"
        return call

    async def watch_changes(self, scope: str = "") -> Any:
        request = pb.WatchChangesRequest(filter=pb.ChangeFilter(scope=scope))
        call = self.opened(self.stub.WatchChanges(request, metadata=self.metadata))
        assert (await call.read()).WhichOneof("kind") == "subscribed"
        return call

    async def watch_prompt(self, scope: str) -> Any:
        request = pb.WatchPromptRequest(scope=scope)
        call = self.opened(self.stub.WatchPrompt(request, metadata=self.metadata))
        await call.read()  # the prompt as it is
        return call

    async def listing(self) -> Any:
        """A listing of every layer with values, its first batch read and the rest left
        unread (too large to be buffered whole)."""
        request = pb.ListRegistrationsRequest(include_values=True)
        call = self.opened(self.stub.ListRegistrations(request, metadata=self.metadata))
        await call.read()
        return call


def peer(sidecar: Sidecar, who: str) -> contextlib.AbstractAsyncContextManager[Peer]:
    return raw(sidecar, who, TOKENS[who], Peer)


async def ended(call: Any) -> tuple[grpc.StatusCode, str, str]:
    """How a stream ended, whatever it still had to deliver: (code, reason, details);
    TimeoutError when it goes on."""
    async with asyncio.timeout(END_WAIT_S):
        with contextlib.suppress(grpc.aio.AioRpcError):
            while await call.read() is not grpc.aio.EOF:
                pass
    trailers = dict(await call.trailing_metadata() or ())
    return await call.code(), trailers.get("dsh-error-reason", ""), await call.details()


async def still_open(call: Any) -> bool:
    return not call.done()


async def unregistered(watch: Any, count: int) -> list[tuple[str, str]]:
    """The next `count` UNREGISTERED events a change watch delivers: (kind, name)."""
    seen: list[tuple[str, str]] = []
    while len(seen) < count:
        message = await watch.read()
        events = [message.event] if message.HasField("event") else list(message.batch.events)
        seen += [
            (pb.ChangeKind.Name(event.kind), event.name)
            for event in events
            if event.action == pb.CHANGE_ACTION_UNREGISTERED
        ]
    return seen


async def fill(peer: Peer) -> None:
    """Values enough that a listing of them waits for its reader (15 MiB)."""
    _, session_id = await peer.opened_session()
    handle = await peer.scope(session_id, "bulk")
    for number in range(256):
        request = pb.RegisterSectionRequest(
            session_id=session_id,
            scope_id=handle,
            name=f"bulk-{number}",
            order=1,
            text="x" * 60_000,
        )
        await peer.stub.RegisterSection(request, metadata=peer.metadata)


async def test_a_reload_removing_a_reader_and_an_agent_ends_each_of_their_streams(
    revocable: Revocable,
) -> None:
    sidecar = revocable.sidecar
    async with (
        peer(sidecar, "admin") as admin,
        peer(sidecar, "agent") as agent,
        peer(sidecar, "reader") as reader,
        peer(sidecar, "bystander") as bystander,
    ):
        await fill(admin)
        watch_all = await admin.watch_changes()
        session, session_id = await agent.opened_session()
        handle = await agent.scope(session_id, "agent")
        await agent.section(session_id, handle, "agent-notes")
        agents = {
            "session": session,
            "Listen": await agent.listen(session_id, handle, "agent-listener"),
            "WatchChanges": await agent.watch_changes("agent"),
            "WatchPrompt": await agent.watch_prompt("agent"),
        }
        readers = {
            "WatchChanges": await reader.watch_changes(),
            "WatchPrompt": await reader.watch_prompt("agent"),
            "ListRegistrations": await reader.listing(),
        }
        _, bystander_session = await bystander.opened_session()
        bystanders = [
            await bystander.watch_changes("bystander"),
            await bystander.watch_prompt("bystander"),
        ]

        revocable.reload(agent=None, reader=None)

        for name, call in {**agents, **{f"reader {k}": v for k, v in readers.items()}}.items():
            code, reason, details = await ended(call)
            assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"), name
            assert details.startswith("credential revoked"), name
        # the session is gone as a dead peer's: its registrations, with their events
        events = await unregistered(watch_all, 3)
        assert sorted(events) == [
            ("CHANGE_KIND_LISTENER", "agent-listener"),
            ("CHANGE_KIND_SCOPE", "agent"),
            ("CHANGE_KIND_SECTION", "agent-notes"),
        ]
        assert sidecar.registry.registrations(session_id) == []
        assert session_id not in {s.id for s in sidecar.state.sessions.all()}
        # another credential keeps everything: its streams, its session
        assert all([await still_open(call) for call in bystanders])
        assert not watch_all.done()
        await bystander.scope(bystander_session, "bystander")
        assert (await bystanders[0].read()).event.name == "bystander"


async def test_a_narrowed_credential_loses_only_what_it_lost(revocable: Revocable) -> None:
    sidecar = revocable.sidecar
    async with (
        peer(sidecar, "admin") as admin,
        peer(sidecar, "agent") as agent,
        peer(sidecar, "reader") as reader,
    ):
        watch_all = await admin.watch_changes()
        session, session_id = await agent.opened_session()
        kept_handle = await agent.scope(session_id, "agent")
        lost_handle = await agent.scope(session_id, "shared")
        kept = await agent.section(session_id, kept_handle, "kept-notes")
        await agent.section(session_id, lost_handle, "shared-notes")
        kept_streams = [
            session,
            await agent.listen(session_id, kept_handle, "kept-listener"),
            await agent.watch_changes("agent"),
            await agent.watch_prompt("agent"),
            await reader.watch_changes("agent"),
            await reader.watch_prompt("agent"),
        ]
        lost_streams = {
            "agent Listen": await agent.listen(session_id, lost_handle, "shared-listener"),
            "agent WatchChanges": await agent.watch_changes("shared"),
            "agent WatchPrompt": await agent.watch_prompt("shared"),
            "reader WatchChanges of every layer": await reader.watch_changes(),
            "reader WatchPrompt": await reader.watch_prompt("shared"),
        }

        revocable.reload(agent=["agent"], reader=["agent"])

        for name, call in lost_streams.items():
            code, reason, details = await ended(call)
            assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"), name
            assert details.endswith("(since a config reload)"), (name, details)
        events = await unregistered(watch_all, 3)
        assert sorted(events) == [
            ("CHANGE_KIND_LISTENER", "shared-listener"),
            ("CHANGE_KIND_SCOPE", "shared"),
            ("CHANGE_KIND_SECTION", "shared-notes"),
        ]
        left = {entry.name for entry in sidecar.registry.registrations(session_id)}
        assert left == {"agent", "kept-notes", "kept-listener"}
        assert all([await still_open(call) for call in kept_streams])
        # what it kept still works, through the same session and handle
        update = pb.UpdateRequest(session_id=session_id, registration_id=kept, text="still mine")
        await agent.stub.Update(update, metadata=agent.metadata)
        # and what it lost is refused from now on, through the handle it still held
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await agent.scope(session_id, "shared")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_reload_that_changes_no_grant_ends_nothing(revocable: Revocable) -> None:
    sidecar = revocable.sidecar
    async with peer(sidecar, "agent") as agent, peer(sidecar, "reader") as reader:
        session, session_id = await agent.opened_session()
        handle = await agent.scope(session_id, "shared")
        await agent.section(session_id, handle, "notes")
        streams = [
            session,
            await agent.listen(session_id, handle, "listener"),
            await reader.watch_changes(),
            await reader.watch_prompt("shared"),
        ]
        revocable.reload(agent=["agent", "shared", "more"], reader=["*"])
        await agent.section(session_id, handle, "more-notes")  # a round trip after it
        assert all([await still_open(call) for call in streams])
        assert len(sidecar.registry.registrations(session_id)) == 4


async def test_a_rotated_token_ends_the_streams_opened_with_the_old_one(
    revocable: Revocable, tmp_path: Path
) -> None:
    sidecar = revocable.sidecar
    async with peer(sidecar, "reader") as reader:
        watch = await reader.watch_changes()
        (tmp_path / "reader.token").write_text("revoke-reader-token-rotated\n")
        assert revocable.reloader.reload("SIGHUP") is not None  # token files are read again
        code, reason, _ = await ended(watch)
    assert (code, reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")


@contextlib.asynccontextmanager
async def agent_provider_in_shared(
    revocable: Revocable, cache: dsp.Cache | None = None
) -> AsyncIterator[tuple[dsp.Client, dsp.Client]]:
    """The admin and the agent connected, the agent's provider "agent-provider" registered in
    `agent`, where the admin's assemblies of `shared` (a child of `agent`) run it."""
    address = revocable.sidecar.address
    async with (
        dsp.connect(address, token=TOKENS["admin"]) as admin,
        dsp.connect(address, token=TOKENS["agent"]) as agent,
    ):
        await admin.scope("agent")
        await admin.scope("shared", parent="agent")
        mine = await agent.scope("agent")
        await mine.section("agent-provider", 30, lambda context: "provided", cache=cache)
        yield admin, agent


def assert_lost_reach(before: dsp.PromptAssembly, after: dsp.PromptAssembly) -> None:
    """The agent's provider was in `before`; in `after` it is skipped, out of reach."""
    assert "agent-provider" in section_names(before)
    assert "agent-provider" not in section_names(after)
    assert [(s.name, s.reason) for s in after.skipped] == [
        ("agent-provider", dsp.Reason.OUT_OF_REACH)
    ]


async def test_a_narrowed_credentials_steps_no_longer_reach_what_it_lost(
    revocable: Revocable,
) -> None:
    """The agent's provider in `agent` ran for `shared` (a child of `agent`) while the agent
    could read `shared`; narrowed, its session goes on but its steps reach only `agent`."""
    async with agent_provider_in_shared(revocable) as (admin, agent):
        before = await admin.assemble(scope="shared")
        revocable.reload(agent=["agent"], reader=["*"])
        after = await admin.assemble(scope="shared")
        own = await agent.assemble(scope="agent")
    assert_lost_reach(before, after)
    assert "agent-provider" in section_names(own)
