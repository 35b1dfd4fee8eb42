"""What a narrowed credential's open streams keep after a reload (issue 34, item 2), past
what test_revocation.py covers: a scope handle is decided again with the parent key its
OpenScope named, as OpenScope decided it (the credential must list both), so a handle bound
under a parent the credential no longer lists goes with what was registered through it;
and a listing that goes on withholds variables' sizes from a reader that lost `values`
from its next batch on, as a listing opened after the reload would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import grpc.aio
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar

from guard.test_revocation import (  # noqa: F401 (revocable: a fixture)
    TOKENS,
    Peer,
    Revocable,
    peer,
    revocable,
    unregistered,
)

LONG = "v" * 200  # long names and scope key: a listing's batches outgrow the stream's window
VARIABLES = 2_000


async def assembled(client: Peer, scope: str) -> set[str]:
    """The names of the sections `client` is given when it assembles `scope`."""
    request = pb.AssembleRequest(context=pb.AssembleContext(scope=scope))
    response = await client.stub.Assemble(request, metadata=client.metadata)
    return {section.name for section in response.assembly.sections}


async def test_a_handle_bound_under_a_parent_the_credential_lost_goes_with_it(
    revocable: Revocable,  # noqa: F811 (the fixture imported above)
) -> None:
    """The agent bound `agent` under `shared` (it listed both), so its assemblies of `agent`
    read `shared`; narrowed to `agent`, that handle is refused as its OpenScope would be now."""
    sidecar = revocable.sidecar
    async with peer(sidecar, "admin") as admin, peer(sidecar, "agent") as agent:
        watch_all = await admin.watch_changes()
        _, admin_session = await admin.opened_session()
        shared = await admin.scope(admin_session, "shared")
        await admin.section(admin_session, shared, "shared-notes")
        session, session_id = await agent.opened_session()
        bound = await agent.scope(session_id, "agent", parent="shared")
        await agent.section(session_id, bound, "agent-notes")
        before = await assembled(agent, "agent")

        revocable.reload(agent=["agent"], reader=["*"])

        assert sidecar.registry.registrations(session_id) == []
        events = await asyncio.wait_for(unregistered(watch_all, 2), 10)
        assert sorted(events) == [
            ("CHANGE_KIND_SCOPE", "agent"),
            ("CHANGE_KIND_SECTION", "agent-notes"),
        ]
        assert not session.done()  # the session goes on: it may still open `agent`
        again = await agent.scope(session_id, "agent")
        await agent.section(session_id, again, "agent-notes")
        after = await assembled(agent, "agent")
    assert {"shared-notes", "agent-notes"} <= before
    assert "agent-notes" in after and "shared-notes" not in after


@contextlib.asynccontextmanager
async def unread_peer(sidecar: Sidecar, who: str) -> AsyncIterator[Peer]:
    """`who`'s raw stub on a channel whose receive window stays small (no BDP probe), so a
    stream it does not read waits on the sidecar's side."""
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(sidecar.address, options=options) as channel:
        client = Peer(pb_grpc.SystemPromptServiceStub(channel), TOKENS[who])
        try:
            yield client
        finally:
            for call in client.streams:
                call.cancel()


async def variables(admin: Peer, count: int) -> None:
    """`count` variables with values in scope LONG, registered by the admin."""
    _, session_id = await admin.opened_session()
    handle = await admin.scope(session_id, LONG)

    async def register(number: int) -> None:
        request = pb.RegisterVariableRequest(
            session_id=session_id, scope_id=handle, name=f"{LONG}{number}", value="pin-4821"
        )
        await admin.stub.RegisterVariable(request, metadata=admin.metadata)

    for start in range(0, count, 100):
        await asyncio.gather(*(register(n) for n in range(start, min(start + 100, count))))


def variable_sizes(batch: pb.ListRegistrationsResponse) -> list[int]:
    return [info.size_bytes for info in batch.registrations if info.kind == pb.CHANGE_KIND_VARIABLE]


async def test_an_open_listing_withholds_sizes_once_its_reader_loses_values(
    revocable: Revocable,  # noqa: F811 (the fixture imported above)
) -> None:
    sidecar = revocable.sidecar
    async with peer(sidecar, "admin") as admin, unread_peer(sidecar, "reader") as reader:
        await variables(admin, VARIABLES)
        request = pb.ListRegistrationsRequest(filter=pb.ChangeFilter(scope=LONG))
        call = reader.opened(reader.stub.ListRegistrations(request, metadata=reader.metadata))
        batches = [await call.read()]

        revocable.reload(agent=["agent", "shared"], reader=["*"], reader_values=False)

        while (batch := await asyncio.wait_for(call.read(), 10)) is not grpc.aio.EOF:
            batches.append(batch)
        assert await call.code() == grpc.StatusCode.OK  # it may still list, without values
    sizes = [variable_sizes(batch) for batch in batches]
    assert sum(map(len, sizes)) == VARIABLES
    assert sizes[0] and set(sizes[0]) == {len("pin-4821")}  # before the reload
    assert sizes[-1] and set(sizes[-1]) == {0}  # built after it
    # each batch built wholly before the reload or wholly after it: none begins with an
    # entry built while the batch before it was still being written
    assert [index for index, batch in enumerate(sizes) if len(set(batch)) > 1] == []
