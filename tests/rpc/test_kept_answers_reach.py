"""Kept Assemble responses and reach (issue 34, items 1 and 6 together): a plan that passes
over a callback out of its owner's reach never takes the response kept for the plan with it
in, though both have the same scope and chain revision, and a response kept for a request's
very bytes is not reused once an owner's reach was bound anew (a reload narrowed it: the
plans are remade, and no revision moves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from guard.test_revocation import (  # noqa: F401 (revocable: a fixture)
    Revocable,
    agent_provider_in_shared,
    assert_lost_reach,
    revocable,
)
from helpers import SidecarFactory, section_names

ADMIN, ALICE = "admin-token-kept-0", "alice-token-kept-1"


def config(folder: Path) -> dict[str, Any]:
    (folder / "admin.token").write_text(ADMIN)
    (folder / "alice.token").write_text(ALICE)
    alice = {"name": "alice", "role": "agent", "scopes": ["alice"], "global": True}
    return {
        "auth_token_file": str(folder / "admin.token"),
        "credentials": [{**alice, "token_file": str(folder / "alice.token")}],
    }


@pytest.fixture
async def sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    return await make_sidecar(**config(tmp_path))


async def test_a_plan_passing_a_provider_over_never_takes_the_full_plans_answer(
    sidecar: Sidecar,
) -> None:
    """alice's and the admin's cacheable providers in the global layer answer assemblies of
    the global scope (every owner reaches it), whose response is kept; a key no handle
    holds and she may not read shares that plan without her provider (still all-cacheable,
    with the admin's): it is not handed her answer."""
    async with (
        dsp.connect(sidecar.address, token=ALICE) as alice,
        dsp.connect(sidecar.address, token=ADMIN) as admin,
    ):
        await alice.section("alice-global", 5, lambda context: "alice's", cache=dsp.Cache.REVISION)
        await admin.section("admin-global", 6, lambda context: "admin's", cache=dsp.Cache.REVISION)
        assert "alice-global" in section_names(await admin.assemble())
        assert "alice-global" in section_names(await admin.assemble())  # kept
        elsewhere = await admin.assemble("nowhere")
        assert "alice-global" not in section_names(elsewhere)
        assert [(s.name, s.reason) for s in elsewhere.skipped] == [
            ("alice-global", dsp.Reason.OUT_OF_REACH)
        ]


async def test_a_narrowed_reach_is_not_answered_from_a_requests_kept_bytes(
    revocable: Revocable,  # noqa: F811 (the fixture imported above)
) -> None:
    """The agent's cacheable provider in `agent` answers the admin's assemblies of `shared`
    (a child of `agent`), whose response is kept for the request's very bytes; narrowed to
    `agent` by a reload, the same bytes are answered without it."""
    async with agent_provider_in_shared(revocable, cache=dsp.Cache.REVISION) as (admin, _):
        await admin.assemble(scope="shared")
        before = await admin.assemble(scope="shared")  # answered from the kept bytes
        revocable.reload(agent=["agent"], reader=["*"])
        after = await admin.assemble(scope="shared")
    assert_lost_reach(before, after)
