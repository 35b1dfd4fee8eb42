"""Prompt-cache awareness in plain Python: what a prompt's stable prefix is and who broke it.

Belongs here: the report of one assembly (provenance, sizes, prefix stability), the blame of
a break, the bounded diff of the first changed part, the history per key, the one call that
reports an assembly and keeps it (`reporter`), a scope's live prompt of static parts
(`live_prompt`) and the tokenizers. Nothing here knows about gRPC. It may import only the
folders before it in `LAYERS` in tests/package/test_package.py.
"""

from .history import Break, HistoryEntry, HistoryKey, KeyHistory, ReportHistory
from .live_prompt import LivePrompt, StaticPrompt
from .report import build_report
from .reporter import Reported, Reporter
from .settings import ReportSettings
from .shown import Shows, hidden, shown_origin, shown_reason
from .tokens import TOKENIZERS, Tokenizer, load_tokenizer
from .tool_order import Freeze
from .values import (
    DEFAULT_LAYOUT,
    Layout,
    PartPrint,
    PrefixStability,
    Previous,
    Report,
    Size,
    Stability,
    ToolOrdering,
)

__all__ = [
    "DEFAULT_LAYOUT",
    "TOKENIZERS",
    "Break",
    "Freeze",
    "HistoryEntry",
    "HistoryKey",
    "KeyHistory",
    "Layout",
    "LivePrompt",
    "PartPrint",
    "PrefixStability",
    "Previous",
    "Report",
    "ReportHistory",
    "ReportSettings",
    "Reported",
    "Reporter",
    "Shows",
    "Size",
    "Stability",
    "StaticPrompt",
    "Tokenizer",
    "ToolOrdering",
    "build_report",
    "hidden",
    "load_tokenizer",
    "shown_origin",
    "shown_reason",
]
