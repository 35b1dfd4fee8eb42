"""The prompt-cache reports' part of the sidecar config: its config keys."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Choice, Count, Named, Reload, setting
from .tokens import TOKENIZERS
from .values import DEFAULT_LAYOUT, Layout


@dataclass(frozen=True)
class ReportSettings:
    """How reports count, how many are kept, and which prefix order they judge."""

    tokenizer: str | None = setting(
        None,
        Choice(tuple(TOKENIZERS)),
        "counts tokens in prompt-cache reports (the `dsh-system-prompt[tokens]` extra);"
        " absent, reports count bytes only",
        reload=Reload.RESTART,
        flag="--tokenizer",
    )
    report_history: int = setting(
        8,
        Count(),
        "recent reported assemblies kept per history key (a scope, or a caller's `report_key`)",
        reload=Reload.RESTART,
    )
    report_keys: int = setting(
        1024,
        Count(),
        "history keys kept for prompt-cache reports, the least recently reported evicted first",
        reload=Reload.RESTART,
    )
    prefix_layout: Layout = setting(
        DEFAULT_LAYOUT,
        Named(Layout),
        'the model server\'s prefix order for reports: "system-first" (DeepSeek) or'
        ' "tools-first" (Anthropic, OpenAI)',
    )
