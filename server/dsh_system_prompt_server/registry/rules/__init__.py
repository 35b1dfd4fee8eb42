"""Rules: waterfall steps the sidecar runs itself, in CEL, with no hop (docs/protocol.md,
"Rules"). A rule's definition (the proto's RuleSpec) compiled and checked at registration
(`compile_rule`, a RULE_INVALID refusal naming the rule and the expression), and applied to an
assembly (`apply`, a RULE_FAILED naming them). The CEL library is loaded on first use.

Inside `registry/`: it may import the registry's own modules (model, errors, limits), never
`assembly/`, which runs rules as steps of its waterfall; the registry's face re-exports what
the floors above need.
"""

from .applied import Inputs, apply, apply_yielding
from .compiled import Rule, compile_rule, invalid
from .operator import RULE_KEYS, OperatorRule, read_rules

__all__ = [
    "RULE_KEYS",
    "Inputs",
    "OperatorRule",
    "Rule",
    "apply",
    "apply_yielding",
    "compile_rule",
    "invalid",
    "read_rules",
]
