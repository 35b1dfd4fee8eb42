"""The values of a prompt-cache report: the layout, each part's print, sizes, the
prefix's stability, the report itself, and what the next report compares with.

Plain values with no behaviour beyond their own fields, so that the report, its
blame and the history all import them from here and not from each other.
"""

from __future__ import annotations

import enum
import sys
from array import array
from dataclasses import dataclass

from ..registry import Origin, PartKey, PartKind, Skipped, Trace
from .words import Named, Words


class Layout(enum.StrEnum):
    """The order a model server puts the tool block and the system prompt in."""

    TOOLS_FIRST = "tools-first"  # Anthropic's and OpenAI's requests: tools, system, messages
    SYSTEM_FIRST = "system-first"  # DeepSeek's chat template: system, then its tools block


DEFAULT_LAYOUT = Layout.SYSTEM_FIRST  # the harness talks to DeepSeek models
# Skipped steps a report's reason names and its history entry keeps; the rest are counted,
# so neither grows with the number of failing callbacks.
MAX_SKIPPED = 4


@dataclass(frozen=True, slots=True)
class PartPrint:
    """One rendered part: what it is, where it came from, its size and fingerprint."""

    kind: PartKind  # a tool, a section or a context
    name: str
    origin: Origin
    bytes: int
    tokens: int | None
    fingerprint: str
    raw: str  # a section's text before interpolation; a tool's description
    parameters: str  # a tool's parameters JSON
    variables: tuple[tuple[str, str | None], ...]  # what a section referenced, and the values
    start: int = 0  # where it sits in the prefix text (characters); contexts: 0
    end: int = 0

    @property
    def key(self) -> PartKey:
        return (self.kind, self.name)

    @property
    def label(self) -> str:
        return f'{self.kind} "{self.name}"'


@dataclass(frozen=True, slots=True)
class Size:
    """A text's size: bytes, and tokens when a tokenizer counted them."""

    bytes: int
    tokens: int | None


@dataclass(frozen=True, slots=True)
class Previous:
    """What the next report of the same history key compares with."""

    layout: Layout
    parts: tuple[PartPrint, ...]  # the prefix's parts in layout order
    contexts: dict[str, str]  # context name -> fingerprint
    text: str  # the prefix text, as laid out
    token_ids: array[int] | None
    trace: Trace | None
    variables: dict[str, Origin]

    def memory(self) -> int:
        """What keeping this costs, in bytes of memory (for the history's budget): its
        strings as Python holds them, and a measured allowance per object."""
        raw = sum(
            sys.getsizeof(p.raw) + sys.getsizeof(p.parameters) + sys.getsizeof(p.name) + 400
            for p in self.parts
        )
        ids = 0 if self.token_ids is None else self.token_ids.itemsize * len(self.token_ids)
        steps = 0 if self.trace is None else sum(200 * len(s.values) for s in self.trace.steps)
        return sys.getsizeof(self.text) + raw + ids + steps + 300 * len(self.contexts)


@dataclass(frozen=True, slots=True)
class PrefixStability:
    """How much of the prefix the previous report of the key shares, and why it broke: what
    a report says and its key's history keeps (without the diff)."""

    has_previous: bool
    stable_bytes: int
    stable_tokens: int | None
    prefix: Size
    first_changed: str
    reason: str
    recomputed: Size  # prefix bytes/tokens after the first change
    # where `reason` names each listener and rule, with its layer: shown per caller (shown.py)
    steps: tuple[Named, ...] = ()

    @property
    def broke(self) -> bool:
        return self.has_previous and bool(self.reason)

    @property
    def words(self) -> Words:
        """`reason` with where it names each listener and rule."""
        return Words(self.reason, self.steps)

    @property
    def stable_share(self) -> float | None:
        """The share of the prefix unchanged since the previous report; None for a first
        report or an empty prefix."""
        if not self.has_previous or not self.prefix.bytes:
            return None
        return self.stable_bytes / self.prefix.bytes


@dataclass(frozen=True, slots=True)
class Stability:
    """A report's prefix stability, with what only the report itself carries."""

    seen: PrefixStability
    messages_recomputed: bool  # every message after the prefix is recomputed too
    diff: str = ""
    previous_evicted: bool = False

    @classmethod
    def first(cls, prefix: Size, evicted: bool) -> Stability:
        """Nothing to compare with: the key's first report (or first since it was evicted)."""
        nothing = Size(bytes=0, tokens=None if prefix.tokens is None else 0)
        seen = PrefixStability(False, 0, nothing.tokens, prefix, "", "", recomputed=nothing)
        return cls(seen, messages_recomputed=False, previous_evicted=evicted)

    @classmethod
    def compared(
        cls, prefix: Size, stable: Size, why: tuple[str, Words] | None = None, diff: str = ""
    ) -> Stability:
        """`stable` of `prefix` is the previous report's; the rest is recomputed. Where it
        broke (`why`: the first changed part and the reason), every message after the
        prefix is recomputed too."""
        first_changed, reason = why or ("", Words())
        tokens = None
        if prefix.tokens is not None and stable.tokens is not None:
            tokens = prefix.tokens - stable.tokens
        recomputed = Size(bytes=prefix.bytes - stable.bytes, tokens=tokens)
        seen = PrefixStability(
            True,
            stable.bytes,
            stable.tokens,
            prefix,
            first_changed,
            reason.text,
            recomputed,
            steps=reason.steps,
        )
        return cls(seen, messages_recomputed=why is not None, diff=diff)


@dataclass(frozen=True, slots=True)
class ToolOrdering:
    """How a stably ordered assembly's tools differ from the order sorting gave them.

    `kept` says the stable order differs from the sorted one; then `position` (0-based) is
    the first place where they differ, `sorted_tool` the tool sorting would have put there
    (breaking the tools prefix from there on) and `kept_tool` the one kept there.
    """

    kept: bool
    position: int = 0
    sorted_tool: str = ""
    kept_tool: str = ""

    def describe(self) -> str:
        if not self.kept:
            return "tool order kept: the same as sorting's"
        return (
            f'tool order kept stable: sorting would have put tool "{self.sorted_tool}" at'
            f' position {self.position}, where tool "{self.kept_tool}" stays'
        )


@dataclass(frozen=True, slots=True)
class Report:
    """One assembly's report: its parts, sizes, prefix stability and variables."""

    tokenizer: str
    layout: Layout
    parts: list[tuple[PartPrint, bool]]  # each part and whether it is stable
    tools: Size
    prompt: Size
    context_snapshot: Size
    stability: Stability
    variables: list[tuple[str, Origin]]
    render_error: str = ""  # the first render failure, naming its part; "" when it rendered
    skipped: tuple[Skipped, ...] = ()  # the steps the assembly went on without
    tool_order: ToolOrdering | None = None  # how a stable order differs from sorting's
