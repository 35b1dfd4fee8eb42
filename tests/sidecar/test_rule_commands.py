"""`dsh-system-prompt rules check` and `rules test`: a rules file compiled and tried offline,
with the sidecar's own compilation and apply (the installed command, no sidecar asked)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Sidecar
from dsh_system_prompt_server.sidecar.prompt_commands import assembly_from_json
from helpers import SidecarFactory
from processes import cli, cli_output
from rules.stock import GITHUB_FIRST, NO_WEB, stocked

RULES = (
    NO_WEB
    + GITHUB_FIRST
    + """[[rules.mutations]]
set_variables = { variables = [{ name = "model", expression = "'v4-' + variables.agent" }] }

[[rules]]
name = "quiet"
match = ["fields.quiet == true"]
mutations = [{ drop_contexts = "context.name == 'clock'" }, { drop_sections = "true" }]
"""
)


async def test_check_compiles_each_rule_and_names_them(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES, encoding="utf-8")
    code, out, err = await cli("rules", "check", str(path))
    assert (code, err) == (0, "")
    assert out == f'{path}: 3 rules compile: "no-web", "github-first", "quiet"\n'


async def test_check_reads_a_sidecar_config_file_too(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.toml"
    path.write_text('persona = "Be brief."\n' + RULES, encoding="utf-8")
    code, out, _ = await cli("rules", "check", str(path))
    assert code == 0
    assert "3 rules compile" in out


@pytest.mark.parametrize(
    ("rules", "said"),
    [
        (
            '[[rules]]\nname = "typo"\nmutations = [{ drop_tools = "tool.nme == \'x\'" }]\n',
            "config key 'rules[0]': rule \"typo\": mutations[0].drop_tools:1:5: undefined field"
            " 'nme' not found in struct 'dsh.systemprompt.v1.ToolSchema'\n"
            " | tool.nme == 'x'\n | ....^\n",
        ),
        (
            '[[rules]]\nname = "kind"\nmatch = ["true", "scope"]\n',
            "config key 'rules[0]': rule \"kind\": match[1]: wants a bool, the expression is a"
            " string\n",
        ),
        (
            '[[rules]]\nname = "a"\n[[rules]]\nname = "b"\nwhen = 1\n',
            "config key 'rules[1].when' is not a rule's key\n",
        ),
    ],
    ids=["cel", "type", "key"],
)
async def test_check_of_a_bad_rule_exits_1_naming_the_rule_the_expression_and_cels_message(
    tmp_path: Path, rules: str, said: str
) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(rules, encoding="utf-8")
    code, out, err = await cli("rules", "check", str(path))
    assert (code, out) == (1, "")
    assert err == f"dsh-system-prompt rules check: {path}: {said}"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "cannot read {path}: No such file or directory"),
        ("[[rules]\n", "{path} is not valid TOML: "),
        ('persona = "x"\n', "{path} has no [[rules]] tables"),
    ],
    ids=["missing", "toml", "no-rules"],
)
async def test_check_of_an_unreadable_file_is_a_usage_error(
    tmp_path: Path, text: str | None, said: str
) -> None:
    path = tmp_path / "rules.toml"
    if text is not None:
        path.write_text(text, encoding="utf-8")
    code, _, err = await cli("rules", "check", str(path))
    assert code == 2
    assert err.startswith(f"dsh-system-prompt rules check: {said.format(path=path)}")


async def test_rules_test_gives_what_the_sidecar_assembles_with_those_rules(
    tmp_path: Path, make_sidecar: SidecarFactory
) -> None:
    """The same registrations on a sidecar without the rules (its `assemble --json` is the
    input) and on one with them in its config: the command's result is the second's."""
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES, encoding="utf-8")
    plain = await make_sidecar()
    ruled = await make_sidecar(**tomllib.loads(RULES))
    fields = {"agent": "ada", "quiet": False}
    expected: dsp.PromptAssembly | None = None
    for sidecar in (plain, ruled):
        async with dsp.connect(sidecar.address) as client:
            await stocked(client)
            await client.scope("team-a")
            if sidecar is ruled:
                expected = await client.assemble("team-a", fields)
                break
            _, printed, _ = await cli(
                "assemble", "--address", plain.address, "--scope", "team-a", "--json"
            )
    (tmp_path / "assembly.json").write_text(printed, encoding="utf-8")
    code, out, err = await cli(
        *("rules", "test", str(rules), "--assembly", str(tmp_path / "assembly.json")),
        *("--scope", "team-a", "--field", "agent=ada", "--field", "quiet=false", "--json"),
    )
    assert (code, err) == (0, "")
    shown = json.loads(out)
    assert expected is not None
    assert assembly_from_json(shown["assembly"]) == expected
    assert shown["rules"] == [
        {
            "name": "github-first",
            "result": "applied",
            "changes": [
                "tools reordered: mcp__github__pr, mcp__github__issue, bash, todo_write, web_fetch",
                'section "who" added',
                'variable "model" set to "v4-ada"',
            ],
        },
        {"name": "no-web", "result": "applied", "changes": ['tool "web_fetch" removed']},
        {"name": "quiet", "result": "not matched"},
    ]


async def test_rules_test_prints_each_rules_changes_then_the_result(
    tmp_path: Path, sidecar: Sidecar, client: dsp.Client
) -> None:
    await stocked(client)
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES, encoding="utf-8")
    _, printed, _ = await cli("assemble", "--address", sidecar.address, "--json")
    (tmp_path / "assembly.json").write_text(printed, encoding="utf-8")
    code, out, _ = await cli(
        *("rules", "test", str(rules), "--assembly", str(tmp_path / "assembly.json")),
        *("--field", "quiet=true"),
    )
    assert code == 0
    lines, _, result = out.partition("\n\n")
    assert lines.splitlines() == [
        'rule "no-web": tool "web_fetch" removed',
        'rule "quiet": section "harness:identity" removed; section "deployment:persona" removed;'
        ' section "intro" removed; section "outro" removed; context "clock" removed',
        'rule "github-first": its scope pattern matches no key of the scope chain: not run',
    ]
    assembly = json.loads(result)
    assert (assembly["sections"], assembly["contexts"]) == ([], [])
    assert [tool["name"] for tool in assembly["tools"]] == [
        "bash",
        "mcp__github__issue",
        "mcp__github__pr",
        "todo_write",
    ]


async def test_a_rule_failing_in_rules_test_exits_1_or_is_skipped_under_ignore(
    tmp_path: Path,
) -> None:
    assembly = tmp_path / "assembly.json"
    assembly.write_text(json.dumps({"sections": [{"name": "s", "text": "x"}]}), encoding="utf-8")
    failing = '[[rules]]\nname = "boom"\nmatch = ["fields.absent == 1"]\n'
    rules = tmp_path / "rules.toml"
    rules.write_text(failing, encoding="utf-8")
    code, out, err = await cli("rules", "test", str(rules), "--assembly", str(assembly))
    assert (code, out) == (1, "")
    assert err == (
        'dsh-system-prompt rules test: rule "boom" failed: match[0]: Key not found in map : '
        '"absent"\n'
    )
    rules.write_text(failing + 'failure_policy = "ignore"\n', encoding="utf-8")
    code, out, _ = await cli("rules", "test", str(rules), "--assembly", str(assembly), "--json")
    assert code == 0
    assert json.loads(out)["rules"] == [
        {
            "name": "boom",
            "result": "skipped",
            "error": 'rule "boom" failed: match[0]: Key not found in map : "absent"',
        }
    ]


async def test_rules_test_of_a_malformed_assembly_is_a_usage_error(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(RULES, encoding="utf-8")
    (tmp_path / "assembly.json").write_text('{"sections": 3}', encoding="utf-8")
    code, _, err = await cli(
        "rules", "test", str(rules), "--assembly", str(tmp_path / "assembly.json")
    )
    assert code == 2
    assert "assembly file" in err


async def test_ls_lists_rules_and_their_definitions_in_the_rules_table_shape(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    await client.section("intro", 10, "Hello.")
    agent = await client.scope("agent-1")
    rule = dsp.Rule(
        [dsp.Mutation.drop_tools("tool.name == variables.banned")],
        match=["'banned' in fields"],
        variables={"banned": "fields.banned"},
        failure_policy=dsp.FailurePolicy.IGNORE,
    )
    await agent.rule("ban", rule)
    code, out, _ = await cli("ls", "--address", sidecar.address, "--kind", "rule")
    assert code == 0
    rows = [line.split() for line in out.splitlines() if "ban" in line]
    assert [row[1:5] for row in rows] == [["rule", "│", "ban", "│"]]
    assert "agent-1" in out and "cel" in out and "intro" not in out
    listed = json.loads(
        await cli_output("ls", "--address", sidecar.address, "--kind", "rule", "--values", "--json")
    )
    assert [entry["value"] for entry in listed["registrations"]] == [
        {
            "match": ["'banned' in fields"],
            "variables": {"banned": "fields.banned"},
            "mutations": [{"drop_tools": "tool.name == variables.banned"}],
            "failure_policy": "ignore",
        }
    ]
