"""A rule reads only the assembly, the fields and the scope: a plan whose only steps besides
static parts are rules is answered from the kept responses for the same request, and a
different field gets its own answer; the CEL library loads only once a rule needs it."""

from __future__ import annotations

import json
import subprocess
import sys

import dsh_system_prompt as dsp
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh_system_prompt import Mutation, Rule, RulePart
from dsh_system_prompt_server import Sidecar
from helpers import raw_channel

from rules.stock import stocked

ASSEMBLE = "/dsh.systemprompt.v1.SystemPromptService/Assemble"


def request(fields: dict[str, str]) -> bytes:
    context = pb.AssembleContext(fields_json=json.dumps(fields))
    return pb.AssembleRequest(context=context).SerializeToString()


async def test_a_rule_only_plan_is_answered_from_the_kept_responses(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await stocked(client)
    greeting = Mutation.upsert_sections(RulePart("hi", 20, "'Hi ' + fields.who"))
    await client.rule("greet", Rule([greeting]))
    plan = sidecar.registry.plan(None)
    assert not plan.is_static and plan.policy is not None  # reusable by the context
    async with raw_channel(sidecar.address) as channel:
        call = channel.unary_unary(ASSEMBLE)
        ada, bob = request({"who": "ada"}), request({"who": "bob"})
        first = await call(ada, timeout=5)
        assert sidecar.state.assembler.kept(ada) == first  # kept for these very bytes
        assert await call(ada, timeout=5) == first
        other = pb.AssembleResponse.FromString(await call(bob, timeout=5))
        assert [s.text for s in other.assembly.sections if s.name == "hi"] == ["Hi bob"]
        assert not other.cacheable  # a client's local cache keeps only all-static answers


async def test_an_ignored_failure_is_never_kept(sidecar: Sidecar, client: dsp.Client) -> None:
    from dsh_system_prompt import FailurePolicy

    await client.rule("flaky", Rule(match=["fields.x == 'y'"], failure_policy=FailurePolicy.IGNORE))
    async with raw_channel(sidecar.address) as channel:
        call = channel.unary_unary(ASSEMBLE)
        encoded = request({})
        await call(encoded, timeout=5)
        assert sidecar.state.assembler.kept(encoded) is None


def _loaded_after(code: str) -> bool:
    probe = f"import sys\n{code}\nprint('cel_expr_python' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1] == "True"


def test_the_cel_library_is_loaded_on_first_use_only() -> None:
    start = "import asyncio\nfrom dsh_system_prompt_server import Registry\nregistry = Registry()"
    assert not _loaded_after(start)
    use = (
        start
        + "\nfrom dsh.systemprompt.v1 import system_prompt_pb2 as pb"
        + "\nregistry.add_rule('s', None, 'r', pb.RuleSpec(match=['true']))"
    )
    assert _loaded_after(use)
