"""The operator's rules: the config file's `[[rules]]` tables, read and compiled when the config
is (a bad one is a ConfigError naming the rule and the expression, at start or at a reload,
which then changes nothing). The registry runs them as the sidecar's own, like the built-in
sections, in every assembly or in those whose scope chain has a key matching `scope`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from google.protobuf import json_format

from ...config import ConfigError
from ..errors import RegistryError
from ..limits import Limits
from .compiled import Rule, compile_rule

# The keys of one [[rules]] table.
RULE_KEYS = frozenset(
    {"name", "scope", "prepend", "match", "variables", "mutations", "failure_policy"}
)
_POLICIES = {"fail": "FAILURE_POLICY_FAIL", "ignore": "FAILURE_POLICY_IGNORE"}


@dataclass(frozen=True)
class OperatorRule:
    """One `[[rules]]` table: its name, where it runs (a scope pattern, or None: every
    assembly), whether it is prepended, and what it does (compiled against the default
    limits: the operator's own rules are not a session's)."""

    name: str
    pattern: str | None
    prepend: bool
    spec: pb.RuleSpec
    compiled: Rule = field(compare=False, repr=False)


def read_rules(name: str, value: object) -> tuple[OperatorRule, ...]:
    """The `[[rules]]` array of tables, each compiled; ConfigError for the first bad one."""
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise ConfigError(f"config key '{name}' must be an array of tables ([[{name}]])")
    rules = tuple(_rule(entry, f"{name}[{index}]") for index, entry in enumerate(value))
    seen: set[str] = set()
    for rule in rules:
        if rule.name in seen:
            raise ConfigError(f"config key '{name}': two rules are named \"{rule.name}\"")
        seen.add(rule.name)
    return rules


def _rule(entry: dict[str, Any], where: str) -> OperatorRule:
    unknown = sorted(set(entry) - RULE_KEYS)
    if unknown:
        raise ConfigError(f"config key '{where}.{unknown[0]}' is not a rule's key")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"config key '{where}.name' must name the rule")
    pattern = entry.get("scope")
    if pattern is not None and (not isinstance(pattern, str) or not pattern):
        raise ConfigError(f"config key '{where}.scope' must be a scope key or pattern")
    prepend = entry.get("prepend", False)
    if not isinstance(prepend, bool):
        raise ConfigError(f"config key '{where}.prepend' must be true or false")
    spec = _spec(entry, where)
    try:
        compiled = compile_rule(name, spec, Limits())
    except RegistryError as error:
        raise ConfigError(f"config key '{where}': {error.message}") from None
    return OperatorRule(name, pattern, prepend, spec, compiled)


def _spec(entry: dict[str, Any], where: str) -> pb.RuleSpec:
    """The table's definition as the proto's RuleSpec (the same fields, in TOML)."""
    given: dict[str, Any] = {
        key: entry[key] for key in ("match", "variables", "mutations") if key in entry
    }
    variables = given.get("variables")
    if isinstance(variables, dict):  # `variables = { name = "expression" }` reads in order
        given["variables"] = [{"name": k, "expression": v} for k, v in variables.items()]
    policy = entry.get("failure_policy")
    if policy is not None:
        if policy not in _POLICIES:
            raise ConfigError(f'config key \'{where}.failure_policy\' must be "fail" or "ignore"')
        given["failure_policy"] = _POLICIES[policy]
    try:
        return json_format.ParseDict(given, pb.RuleSpec())
    except json_format.ParseError as error:
        raise ConfigError(f"config key '{where}': {error}") from None
