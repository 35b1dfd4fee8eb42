"""Prompt-cache history: its value types, and reading a model server's usage for it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsh.systemprompt.v1 import system_prompt_pb2 as pb

from ._convert import CHANGE_KINDS, LAYOUTS, size_from_proto
from .errors import as_reason, invalid_value
from .types import PrefixLayout, Size, SkippedCount


@dataclass(frozen=True)
class CacheHistoryEntry:
    """One reported assembly: the predicted stable prefix, and what the server observed."""

    sequence: int  # 1 for the key's first report
    revision: int
    prefix_layout: PrefixLayout
    has_previous: bool
    first_changed: str
    reason: str
    prefix: Size
    stable_bytes: int
    stable_tokens: int | None  # predicted cached tokens, with a tokenizer
    recomputed: Size
    observed_cached_tokens: int | None  # what the model server said (report_usage)
    observed_prompt_tokens: int | None
    # the steps it went on without, by kind and reason in the order first skipped
    skipped_counts: tuple[SkippedCount, ...] = ()


@dataclass(frozen=True)
class CacheHistory:
    """How often the prefix broke for one history key, which parts broke it, and the cost."""

    key: str  # 'scope "agent-1"' or 'key "conv-7"'
    reports: int
    breaks: int
    breakers: list[tuple[str, int]]  # (part, breaks), most first
    recomputed: Size  # in total
    recent: list[CacheHistoryEntry]  # oldest first
    evicted: bool  # its earlier history was evicted to make room for other keys


@dataclass(frozen=True)
class Usage:
    """The cache figures of a model server's usage object."""

    cached_tokens: int
    prompt_tokens: int | None


def usage_from(usage: Mapping[str, Any] | Any) -> Usage:
    """Read cached and prompt tokens from a DeepSeek, Anthropic, OpenAI or Gemini usage object.

    DeepSeek: prompt_cache_hit_tokens (+ prompt_cache_miss_tokens); Anthropic:
    cache_read_input_tokens (+ cache_creation_input_tokens, input_tokens); OpenAI:
    prompt_tokens_details.cached_tokens (or input_tokens_details in the Responses API);
    Gemini: cached_content_token_count and prompt_token_count (usage_metadata).
    SDK objects with model_dump() are read as their dicts, dataclasses by their fields.
    """
    if hasattr(usage, "model_dump"):
        usage = usage.model_dump()
    elif dataclasses.is_dataclass(usage) and not isinstance(usage, type):
        usage = {f.name: getattr(usage, f.name) for f in dataclasses.fields(usage)}
    if not isinstance(usage, Mapping):
        raise invalid_value(f"usage must be a mapping, not {type(usage).__name__}")
    if "prompt_cache_hit_tokens" in usage:  # DeepSeek
        hit = _number(usage["prompt_cache_hit_tokens"])
        total = usage.get("prompt_tokens")
        if total is None and "prompt_cache_miss_tokens" in usage:
            total = hit + _number(usage["prompt_cache_miss_tokens"])
        return Usage(hit, None if total is None else _number(total))
    if "cache_read_input_tokens" in usage:  # Anthropic: input_tokens excludes cache reads
        read = _number(usage["cache_read_input_tokens"])
        if "input_tokens" not in usage:
            return Usage(read, None)
        written = _number(usage.get("cache_creation_input_tokens") or 0)
        return Usage(read, read + written + _number(usage["input_tokens"]))
    for cached_key, total_key in (
        ("cached_content_token_count", "prompt_token_count"),  # Gemini, google-genai's names
        ("cachedContentTokenCount", "promptTokenCount"),  # Gemini, the REST API's names
    ):  # no cached-content count (or None) when nothing was cached; the total includes it
        if total_key in usage and usage[total_key] is not None:
            return Usage(_number(usage.get(cached_key) or 0), _number(usage[total_key]))
    for details, total_key in (
        ("prompt_tokens_details", "prompt_tokens"),
        ("input_tokens_details", "input_tokens"),
    ):  # OpenAI: chat completions, then responses
        found = usage.get(details)
        if found is not None and hasattr(
            found, "model_dump"
        ):  # a dataclass's field (openai-agents' Usage)
            found = found.model_dump()
        if isinstance(found, Mapping) and "cached_tokens" in found:
            prompt = usage.get(total_key)
            cached = _number(found["cached_tokens"])
            return Usage(cached, None if prompt is None else _number(prompt))
    raise invalid_value(
        "usage has no cached-token figure (prompt_cache_hit_tokens, cache_read_input_tokens"
        " or prompt_tokens_details.cached_tokens)"
    )


def _number(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_value(f"usage token counts must be whole numbers >= 0, not {value!r}")
    return value


def entry_from_proto(message: pb.CacheHistoryEntry) -> CacheHistoryEntry:
    return CacheHistoryEntry(
        sequence=message.sequence,
        revision=message.revision,
        prefix_layout=LAYOUTS.get(message.prefix_layout, "system-first"),
        has_previous=message.has_previous,
        first_changed=message.first_changed,
        reason=message.reason,
        prefix=size_from_proto(message.prefix),
        stable_bytes=message.stable_bytes,
        stable_tokens=message.stable_tokens if message.HasField("stable_tokens") else None,
        recomputed=size_from_proto(message.recomputed),
        observed_cached_tokens=(
            message.observed_cached_tokens if message.HasField("observed_cached_tokens") else None
        ),
        observed_prompt_tokens=(
            message.observed_prompt_tokens if message.HasField("observed_prompt_tokens") else None
        ),
        skipped_counts=tuple(
            SkippedCount(
                kind=CHANGE_KINDS.get(counted.kind, "unknown"),
                reason=as_reason(counted.reason),
                count=counted.count,
            )
            for counted in message.skipped_counts
        ),
    )


def history_from_proto(message: pb.CacheHistory) -> CacheHistory:
    return CacheHistory(
        key=message.key,
        reports=message.reports,
        breaks=message.breaks,
        breakers=[(b.part, b.count) for b in message.breakers],
        recomputed=size_from_proto(message.recomputed),
        recent=[entry_from_proto(entry) for entry in message.recent],
        evicted=message.evicted,
    )
