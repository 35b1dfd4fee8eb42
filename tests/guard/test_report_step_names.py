"""A prompt-cache report names only the steps its reader's credential is shown by name, as an
assembly's `skipped` does (docs/operations.md, "Trust model"): the break reason ("listener
"x" changed ...", "this assembly skipped listener ...") and the parts' sources name a
listener held in the global layer or in a scope the credential does not list by its layer
alone, in Assemble's report, GetCacheHistory and the admin Cache view. Before, a reader of a
scope was told the name of the admin's global listeners in every report of that scope."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import dsh_system_prompt as dsp
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt import Mutation, Rule, RulePart
from dsh_system_prompt_server import Sidecar
from helpers import SidecarFactory, credentialed, raw_channel, raw_stub

TOKENS = {
    "admin": "report-names-admin-token-0",
    "carol": "report-names-carol-token-1",  # an agent of carol's scope
    "dash": "report-names-dash-token-2",  # a reader of carol's scope, with values
    "everyone": "report-names-everyone-token-3",  # a reader of every scope
}
CREDENTIALS = [
    {"name": "carol", "role": "agent", "scopes": ["carol"]},
    {"name": "dash", "role": "reader", "scopes": ["carol"], "values": True},
    {"name": "everyone", "role": "reader", "scopes": ["*"], "values": True},
]
STAMP, FAILING = "admins-stamp-listener", "admins-failing-listener"
NAMED = ["admin", "everyone"]  # shown every step by name


@pytest.fixture
async def sidecar(make_sidecar: SidecarFactory, tmp_path: Path) -> Sidecar:
    return await credentialed(
        make_sidecar, tmp_path, TOKENS, CREDENTIALS, admin_listen="127.0.0.1:0"
    )


async def stamp(assembly: Any, context: dsp.AssembleContext, next_: dsp.Next) -> Any:
    result = await next_()
    for index, part in enumerate(result.sections):  # the turn stamped on carol's rules
        if part.name == "rules":
            turned = f"{part.text} (turn {context.get('turn')})"
            result.sections[index] = dsp.AssembledSection(part.name, turned)
    return result


async def fails(assembly: Any, context: Any, next_: dsp.Next) -> Any:
    raise RuntimeError("the failing listener's words")


@contextlib.asynccontextmanager
async def steps(sidecar: Sidecar) -> AsyncIterator[None]:
    """carol's section; two global listeners of the admin's held in bob's scope: one stamps
    the turn on it, one fails under IGNORE; the admin reports two turns of carol's."""
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin:
        await (await admin.scope("carol")).section("rules", 10, "Be precise.")
        bob = await admin.scope("bob")
        await bob.on_assemble(stamp, global_=True, name=STAMP)
        ignore = dsp.FailurePolicy.IGNORE
        await bob.on_assemble(fails, global_=True, name=FAILING, failure_policy=ignore)
        for turn in (1, 2):
            await assemble(sidecar, "admin", turn)
        yield


async def assemble(sidecar: Sidecar, who: str, turn: int) -> pb.AssemblyReport:
    """`who`'s report on carol's assembly of `turn`."""
    context = pb.AssembleContext(scope="carol", fields_json=json.dumps({"turn": turn}))
    request = pb.AssembleRequest(context=context, report=True)
    async with raw_channel(sidecar.address) as channel:
        response = await raw_stub(channel).Assemble(request, metadata=bearer(who))
    return response.report


def bearer(who: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


def check(text: str, who: str) -> None:
    """`text` names the admin's listeners to who is shown them, else their layer alone."""
    if who in NAMED:
        assert f'listener "{STAMP}" changed section "rules"' in text
        assert f'this assembly skipped listener "{FAILING}"' in text
    else:
        assert 'a listener (global) changed section "rules"' in text
        assert "this assembly skipped a listener (global)" in text
        assert STAMP not in text and FAILING not in text


@pytest.mark.parametrize("who", ["carol", "admin"])  # a reader never reports
async def test_assembles_report_names_only_the_steps_shown(sidecar: Sidecar, who: str) -> None:
    async with steps(sidecar):
        report = await assemble(sidecar, who, 3)
    check(report.stability.reason, who)
    (rules,) = [part for part in report.parts if part.name == "rules"]
    assert rules.source.kind == pb.SOURCE_KIND_LISTENER
    shown = STAMP if who in NAMED else ""
    assert (rules.source.listener, STAMP in rules.source.description) == (shown, bool(shown))
    assert [step.name for step in report.skipped] == [shown and FAILING]


@pytest.mark.parametrize("who", ["dash", "carol", *NAMED])
async def test_cache_history_names_only_the_steps_shown(sidecar: Sidecar, who: str) -> None:
    async with steps(sidecar), raw_channel(sidecar.address) as channel:
        request = pb.GetCacheHistoryRequest(scope="carol")
        response = await raw_stub(channel).GetCacheHistory(request, metadata=bearer(who))
    assert len(response.history.recent) == 2
    check(response.history.recent[-1].reason, who)


async def admin_page(sidecar: Sidecar, who: str, path: str) -> str:
    """The admin page at `path` as `who` reads it, its quotes unescaped, in `steps`' state."""
    async with steps(sidecar):
        return await page_now(sidecar, who, path)


async def page_now(sidecar: Sidecar, who: str, path: str) -> str:
    """The admin page at `path` as `who` reads it now, its quotes unescaped."""
    assert sidecar.admin is not None
    url = sidecar.admin.url.rstrip("/") + path
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers=dict(bearer(who))) as response,
    ):
        assert response.status == 200
        page = await response.text()
    return page.replace("&#34;", '"').replace("&quot;", '"')


@pytest.mark.parametrize("who", ["dash", *NAMED])
async def test_the_admin_cache_view_names_only_the_steps_shown(sidecar: Sidecar, who: str) -> None:
    page = await admin_page(sidecar, who, "/cache?scope=carol")
    assert 'id="last-break"' in page
    check(page, who)


@pytest.mark.parametrize("who", ["dash", *NAMED])
async def test_the_admin_prompt_view_names_only_the_steps_shown(sidecar: Sidecar, who: str) -> None:
    """Its list of the steps that run for the scope, as the Scopes view lists them."""
    page = await admin_page(sidecar, who, "/prompt?scope=carol")
    if who in NAMED:
        assert STAMP in page and FAILING in page
    else:
        assert STAMP not in page and FAILING not in page
        assert page.count("a listener (global)") == 2


@pytest.mark.parametrize("who", ["dash", *NAMED])
async def test_a_prompt_watch_report_names_only_the_steps_shown(sidecar: Sidecar, who: str) -> None:
    """A global rule of the admin's, held in bob's scope, writes carol's intro: the report
    of `who`'s WatchPrompt of carol names it as a source only to who is shown its name."""
    intro = Rule([Mutation.upsert_sections(RulePart("intro", 5, "'Hi.'"))])
    async with dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin:
        await (await admin.scope("carol")).section("rules", 10, "Be precise.")
        await (await admin.scope("bob")).rule("admins-rule", intro, global_=True)
        async with raw_channel(sidecar.address) as channel:
            request = pb.WatchPromptRequest(scope="carol")
            stream = raw_stub(channel).WatchPrompt(request, metadata=bearer(who))
            first = await stream.read()
            stream.cancel()
    (part,) = [part for part in first.report.parts if part.name == "intro"]
    assert part.source.kind == pb.SOURCE_KIND_RULE
    if who in NAMED:
        assert (part.source.rule, part.source.description) == ("admins-rule", 'rule "admins-rule"')
    else:
        assert (part.source.rule, part.source.description) == ("", "a rule (global)")


SAME = "shared-name"  # carol's listener's name, and the admin's global one's


@pytest.mark.parametrize("who", ["carol", "dash", "admin"])
async def test_a_step_shown_keeps_its_name_beside_a_hidden_one_of_the_same_name(
    sidecar: Sidecar, who: str
) -> None:
    """carol's listener stamps her rules and the admin's global listener of the same kind and
    name, held in bob's scope, fails under IGNORE: a reader of carol's scope is shown her
    listener by name and the admin's by its layer alone, each where the reason names it, in
    GetCacheHistory, Assemble's report and the admin Cache view's last break. Before, a step
    was found in the reason by its name, so both were hidden."""
    async with (
        dsp.connect(sidecar.address, token=TOKENS["admin"]) as admin,
        dsp.connect(sidecar.address, token=TOKENS["carol"]) as carol,
    ):
        own = await carol.scope("carol")
        await own.section("rules", 10, "Be precise.")
        await own.on_assemble(stamp, name=SAME)
        ignore = dsp.FailurePolicy.IGNORE
        await (await admin.scope("bob")).on_assemble(
            fails, global_=True, name=SAME, failure_policy=ignore
        )
        for turn in (1, 2):
            await assemble(sidecar, "admin", turn)
        async with raw_channel(sidecar.address) as channel:
            request = pb.GetCacheHistoryRequest(scope="carol")
            history = await raw_stub(channel).GetCacheHistory(request, metadata=bearer(who))
        reasons = [history.history.recent[-1].reason]
        page = "" if who == "carol" else await page_now(sidecar, who, "/cache?scope=carol")
        if who != "dash":  # a reader never reports
            reasons.append((await assemble(sidecar, who, 3)).stability.reason)
    hidden = "a listener (global)" if who != "admin" else f'listener "{SAME}"'
    expected = (
        f'listener "{SAME}" changed section "rules";'
        f" this assembly skipped {hidden} (LISTENER_FAILED)"
    )
    assert reasons == [expected] * len(reasons)
    assert who == "carol" or f"</strong>: {expected}." in page  # an agent reads no admin page
