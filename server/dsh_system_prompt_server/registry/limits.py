"""Size and count limits: generous for real agents, safe for a small pod."""

from __future__ import annotations

from dataclasses import dataclass

from dsh_system_prompt_core import Reason

from ..config import Count, names, setting
from .errors import RegistryError, Status
from .model import Tool, ToolSet

_QUOTA = "RESOURCE_EXHAUSTED `QUOTA_EXCEEDED`"
_TOO_LARGE = "INVALID_ARGUMENT `VALUE_TOO_LARGE`"


def quota_limit(default: int, what: str = "") -> int:
    """A [limits] count past which a registration or stream is refused QUOTA_EXCEEDED."""
    return setting(default, Count(), f"{_QUOTA}: {what}" if what else _QUOTA)


def size_limit(default: int, what: str) -> int:
    """A [limits] size or count past which a value is refused VALUE_TOO_LARGE."""
    return setting(default, Count(), f"{_TOO_LARGE}: {what}")


@dataclass(frozen=True)
class Limits:
    """Limits the registry enforces before it changes anything: config table [limits]."""

    max_name_bytes: int = size_limit(256, "names, scope keys, labels")
    max_text_bytes: int = size_limit(
        256 * 1024,
        "section and context texts, variable values (a dynamic answer over it fails the assembly)",
    )
    max_tool_schema_bytes: int = size_limit(64 * 1024, "one tool's description and parameters JSON")
    max_registrations_per_session: int = quota_limit(10_000)
    max_listeners: int = quota_limit(1_000)
    max_listeners_per_peer: int = quota_limit(
        100,
        "listeners the sessions of one client may hold together, headroom for others (Quotas"
        " per client)",
    )
    max_total_bytes: int = quota_limit(
        256 * 1024 * 1024,
        "the registered values of every session together (texts, variable values, static tool"
        " schemas; dynamic answers are bounded by `max_text_bytes` instead)",
    )
    max_bytes_per_peer: int = quota_limit(
        64 * 1024 * 1024,
        "the registered values of one client's sessions together, a quarter of"
        " `max_total_bytes` (Quotas per client); an update counts what it grows by",
    )
    max_fields_bytes: int = setting(
        64 * 1024,
        Count(),
        f"{_TOO_LARGE} naming `fields_json`: an assemble context's fields, measured before they"
        " are parsed (and an Assemble request larger than they allow, from its byte count)",
    )
    max_list_items: int = size_limit(
        1024,
        "entries of any one repeated field of a request, counted before any is read; a session"
        " or listener stream that sends one is closed with it",
    )
    max_rules: int = setting(256, Count(), f"{_QUOTA}: rules registered by sessions together")
    max_rules_per_session: int = setting(64, Count(), f"{_QUOTA}: rules one session may hold")
    max_rule_expressions: int = setting(
        32,
        Count(),
        "INVALID_ARGUMENT `RULE_INVALID`: CEL expressions of one rule (match, variables,"
        " predicates, texts and values; a rule of seven holds about 30 KB)",
    )
    max_rule_expression_bytes: int = setting(
        4096, Count(), "INVALID_ARGUMENT `RULE_INVALID`: one CEL expression of a rule"
    )
    max_rule_cost: int = setting(
        10_000_000,
        Count(),
        "INVALID_ARGUMENT `RULE_INVALID`: a rule's worst-case cost over its bounded inputs in one"
        " assembly, estimated when it is registered, in units of about a nanosecond"
        ' (docs/protocol.md, "Rules")',
    )
    max_rule_evaluation_cost: int = setting(
        5_000_000,
        Count(),
        "INVALID_ARGUMENT `RULE_INVALID`: one evaluation's worst-case cost (an expression, a"
        " predicate over all its items), estimated when the rule is registered: the longest the"
        " sidecar's other callers wait for a rule, which hands them the loop between evaluations",
    )
    max_rule_items: int = setting(
        256,
        Count(),
        "ABORTED `RULE_FAILED` (or skipped under IGNORE): tools, sections, contexts or variables"
        " of an assembly a rule reading them is applied to; rules' costs are estimated for"
        " at most this many",
    )
    max_rule_fields_bytes: int = setting(
        1024,
        Count(),
        "ABORTED `RULE_FAILED` (or skipped under IGNORE): an assemble context's fields_json a"
        " rule reading `fields` is applied to; rules' costs are estimated for at most this",
    )
    max_callback_cache_bytes: int = setting(
        32 * 1024 * 1024,
        Count(),
        "never refused: cached callback answers and waterfall results, keys included; the"
        " least recently used evicted first",
    )

    def check_name(self, what: str, name: str) -> None:
        _check_size(f"{what} name", name, self.max_name_bytes)

    def check_text(self, what: str, text: str) -> None:
        _check_size(what, text, self.max_text_bytes)

    def check_fields(self, fields_json: str) -> None:
        """An assemble context's fields, before anything parses them."""
        limit = self.max_fields_bytes
        _check_size("assemble context fields_json", fields_json, limit, LIMIT_KEYS.max_fields_bytes)

    def check_count(self, what: str, count: int) -> None:
        """A repeated field of a request (`what` names it), before anything reads it."""
        if count > self.max_list_items:
            raise RegistryError(
                Status.INVALID_ARGUMENT,
                Reason.VALUE_TOO_LARGE,
                f"{what} has {count} entries, over the limit of {self.max_list_items}"
                f" ({LIMIT_KEYS.max_list_items})",
            )

    def check_total(self, total: int, adding: int) -> None:
        """Refuse `adding` bytes of values when `total` are registered already."""
        if adding and total + adding > self.max_total_bytes:
            raise quota_exceeded(
                f"registered values would take {total + adding} bytes, over the sidecar's"
                f" budget of {self.max_total_bytes} ({LIMIT_KEYS.max_total_bytes})"
            )

    def check_tools(self, tools: ToolSet) -> None:
        for tool in tools.schemas:
            self.check_tool(tool)

    def check_tool(self, tool: Tool) -> None:
        self.check_name("tool", tool.name)
        size = _size(tool.description) + _size(tool.parameters_json)
        if size > self.max_tool_schema_bytes:
            raise too_large(f'tool "{tool.name}" schema', size, self.max_tool_schema_bytes)


LIMIT_KEYS = names(Limits, "limits")  # how messages name these keys: 'limits.max_tools'


def too_large(what: str, size: int, limit: int, key: str = "") -> RegistryError:
    """INVALID_ARGUMENT VALUE_TOO_LARGE; `key` names the config key of the limit."""
    return RegistryError(
        Status.INVALID_ARGUMENT,
        Reason.VALUE_TOO_LARGE,
        f"{what} is {size} bytes, over the limit of {limit}" + (f" ({key})" if key else ""),
    )


def quota_exceeded(message: str) -> RegistryError:
    return RegistryError(Status.RESOURCE_EXHAUSTED, Reason.QUOTA_EXCEEDED, message)


def value_bytes(value: object) -> int:
    """What a registered value takes against `max_total_bytes` (a provider's: nothing)."""
    if isinstance(value, str):
        return _size(value)
    if isinstance(value, ToolSet):
        return sum(
            _size(tool.name) + _size(tool.description) + _size(tool.parameters_json)
            for tool in value.schemas
        )
    return 0


def _size(text: str) -> int:
    # UTF-8 is at most 4 bytes a character: skip the encoding when that already fits.
    return len(text) if text.isascii() else len(text.encode())


def _check_size(what: str, text: str, limit: int, key: str = "") -> None:
    if len(text) > limit or (not text.isascii() and len(text) * 4 > limit):
        size = _size(text)
        if size > limit:
            raise too_large(what, size, limit, key)
