"""The operator's rules in the config file (`[[rules]]`): the sidecar's own, applied at start
and reloaded live; a bad one is a ConfigError naming the rule and the expression at start, and
a reload with one changes nothing."""

from __future__ import annotations

from pathlib import Path

import dsh_system_prompt as dsp
import pytest
from dsh_system_prompt_server import Registry, RegistrySettings, parse_config
from dsh_system_prompt_server.config import ConfigError
from helpers import eventually, tool, tool_names
from processes import replace_file, serve_config

from rules.stock import GITHUB_FIRST, NO_WEB


async def test_config_rules_apply_everywhere_or_where_the_scope_pattern_matches(
    client_of: object,
) -> None:
    config = parse_config(_toml(NO_WEB + GITHUB_FIRST))
    async with client_of(**_toml(NO_WEB + GITHUB_FIRST)) as client:  # type: ignore[operator]
        await client.tools([tool("bash"), tool("mcp__github__pr"), tool("web_fetch")])
        await client.scope("team-a")
        unmatched = await client.assemble(fields={"agent": "x"})
        assert tool_names(unmatched) == ["bash", "mcp__github__pr"]
        assembly = await client.assemble("team-a", fields={"agent": "x"})
        assert tool_names(assembly) == ["mcp__github__pr", "bash"]
        assert dsp.AssembledSection("who", "Agent x") in assembly.sections
        snapshot = await client.snapshot(kinds=["rule"])
        assert [(r.name, r.owner_label) for r in snapshot.registrations] == [
            ("no-web", "built-in"),
            ("github-first", "built-in"),
        ]
    assert [rule.name for rule in config.registry.rules] == ["no-web", "github-first"]


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[[rules]]\nname = "typo"\nmatch = ["fields.a == 1", "tool.x"]\n',
            "config key 'rules[0]': rule \"typo\": match[1]:1:5: undeclared reference to 'tool.x'",
        ),
        ('[[rules]]\nmatch = ["true"]\n', "config key 'rules[0].name' must name the rule"),
        (
            '[[rules]]\nname = "a"\n[[rules]]\nname = "a"\n',
            "config key 'rules': two rules are named \"a\"",
        ),
        ('[[rules]]\nname = "a"\nwhen = 1\n', "config key 'rules[0].when' is not a rule's key"),
        (
            '[[rules]]\nname = "a"\nfailure_policy = "maybe"\n',
            'config key \'rules[0].failure_policy\' must be "fail" or "ignore"',
        ),
        (
            '[[rules]]\nname = "a"\nmutations = [{ drop = "true" }]\n',
            "config key 'rules[0]': Failed to parse mutations field: Message type"
            ' "dsh.systemprompt.v1.RuleMutation" has no field named "drop"',
        ),
    ],
    ids=["cel", "no-name", "twice", "unknown-key", "policy", "unknown-operation"],
)
def test_a_bad_config_rule_is_a_config_error_naming_it(toml: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config(_toml(toml))
    assert str(refused.value).startswith(message)


async def test_a_reload_adds_updates_and_removes_config_rules_as_change_events() -> None:
    registry = Registry(RegistrySettings(rules=parse_config(_toml(NO_WEB)).registry.rules))
    subscription = registry.changes.subscribe(16)
    changed = parse_config(_toml(NO_WEB.replace("web_", "net_") + GITHUB_FIRST)).registry.rules
    registry.reconfigure(RegistrySettings(rules=changed))
    registry.reconfigure(RegistrySettings(rules=changed))  # the same rules: nothing
    registry.reconfigure(RegistrySettings())
    events = [await subscription.next() for _ in range(4)]
    assert [(e.kind.value, e.action.value, e.name) for e in events] == [  # type: ignore[union-attr]
        ("rule", "updated", "no-web"),
        ("rule", "registered", "github-first"),
        ("rule", "unregistered", "no-web"),
        ("rule", "unregistered", "github-first"),
    ]


async def test_config_rules_reload_live_and_a_bad_edit_changes_nothing(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.toml"
    async with serve_config(config, NO_WEB, "--config-poll", "0.1") as (served, client):
        await client.tools([tool("bash"), tool("net_fetch"), tool("web_fetch")])
        assert tool_names(await client.assemble()) == ["bash", "net_fetch"]
        replace_file(config, NO_WEB.replace("web_", "net_"))

        async def reloaded() -> bool:
            return tool_names(await client.assemble()) == ["bash", "web_fetch"]

        await eventually(reloaded, "the reloaded rule", timeout=10)
        replace_file(config, NO_WEB.replace("startsWith", "startsWit"))
        await eventually(lambda: "keeping the running config" in served.logs(), "the log line")
        kept = served.logs().split("keeping the running config")[1]
        assert (
            "rule \"no-web\": mutations[0].drop_tools:1:20: undeclared reference to 'startsWit'"
            in (kept)
        )
        assert tool_names(await client.assemble()) == ["bash", "web_fetch"]


def _toml(text: str) -> dict[str, object]:
    import tomllib

    return tomllib.loads(text)
