/** Prompt-cache history: reading it, and reading a model server's usage to report against it. */

import type * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { CHANGE_KINDS, layoutFromProto, sizeFromProto } from "./convert.js";
import { invalid } from "./errors.js";
import type { CacheHistory, CacheHistoryEntry } from "./types.js";

/** The cache figures of a model server's usage object. */
export interface Usage {
  cachedTokens: number;
  promptTokens?: number | undefined;
}

/**
 * Read cached and prompt tokens from a DeepSeek, Anthropic, OpenAI, Gemini or AI SDK usage object.
 *
 * DeepSeek: prompt_cache_hit_tokens (+ prompt_cache_miss_tokens); Anthropic:
 * cache_read_input_tokens (+ cache_creation_input_tokens, input_tokens); OpenAI:
 * prompt_tokens_details.cached_tokens (or input_tokens_details in the Responses API);
 * Gemini: usageMetadata's promptTokenCount (+ cachedContentTokenCount); the AI SDK:
 * inputTokens and inputTokenDetails.cacheReadTokens.
 */
export function usageFrom(usage: unknown): Usage {
  if (usage === null || typeof usage !== "object" || Array.isArray(usage)) {
    throw invalid(`usage must be an object, not ${usage === null ? "null" : typeof usage}`);
  }
  const fields = usage as Record<string, unknown>;
  if ("prompt_cache_hit_tokens" in fields) {
    // DeepSeek
    const hit = count(fields["prompt_cache_hit_tokens"]);
    let total = fields["prompt_tokens"];
    if (total === undefined && "prompt_cache_miss_tokens" in fields) total = hit + count(fields["prompt_cache_miss_tokens"]);
    return { cachedTokens: hit, promptTokens: total === undefined ? undefined : count(total) };
  }
  if ("cache_read_input_tokens" in fields) {
    // Anthropic: input_tokens excludes cache reads
    const read = count(fields["cache_read_input_tokens"]);
    if (!("input_tokens" in fields)) return { cachedTokens: read };
    const written = count(fields["cache_creation_input_tokens"] ?? 0);
    return { cachedTokens: read, promptTokens: read + written + count(fields["input_tokens"]) };
  }
  if ("promptTokenCount" in fields && fields["promptTokenCount"] != null) {
    // Gemini's usageMetadata: no cachedContentTokenCount when nothing was cached
    return {
      cachedTokens: count(fields["cachedContentTokenCount"] ?? 0),
      promptTokens: count(fields["promptTokenCount"]),
    };
  }
  const sdkDetails = fields["inputTokenDetails"];
  if (sdkDetails !== null && typeof sdkDetails === "object" && "cacheReadTokens" in sdkDetails) {
    // The AI SDK's LanguageModelUsage (generateText's usage)
    const read = (sdkDetails as Record<string, unknown>)["cacheReadTokens"];
    const total = fields["inputTokens"];
    return {
      cachedTokens: count(read ?? 0),
      promptTokens: total === undefined ? undefined : count(total),
    };
  }
  for (const [details, totalKey] of [
    ["prompt_tokens_details", "prompt_tokens"],
    ["input_tokens_details", "input_tokens"],
  ] as const) {
    // OpenAI: chat completions, then responses
    const found = fields[details];
    if (found !== null && typeof found === "object" && "cached_tokens" in found) {
      const prompt = fields[totalKey];
      return {
        cachedTokens: count((found as Record<string, unknown>)["cached_tokens"]),
        promptTokens: prompt === undefined ? undefined : count(prompt),
      };
    }
  }
  throw invalid(
    "usage has no cached-token figure (prompt_cache_hit_tokens, cache_read_input_tokens" +
      " or prompt_tokens_details.cached_tokens)",
  );
}

function count(value: unknown): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw invalid(`usage token counts must be whole numbers >= 0, not ${JSON.stringify(value)}`);
  }
  return value;
}

export function entryFromProto(message: pb.CacheHistoryEntry | undefined): CacheHistoryEntry {
  return {
    sequence: Number(message?.sequence ?? 0),
    revision: Number(message?.revision ?? 0),
    prefixLayout: layoutFromProto(message?.prefixLayout ?? 0),
    hasPrevious: message?.hasPrevious ?? false,
    firstChanged: message?.firstChanged ?? "",
    reason: message?.reason ?? "",
    prefix: sizeFromProto(message?.prefix),
    stableBytes: Number(message?.stableBytes ?? 0),
    stableTokens: optional(message?.stableTokens),
    recomputed: sizeFromProto(message?.recomputed),
    observedCachedTokens: optional(message?.observedCachedTokens),
    observedPromptTokens: optional(message?.observedPromptTokens),
    skippedCounts: (message?.skippedCounts ?? []).map((counted) => ({
      kind: CHANGE_KINDS[counted.kind] ?? "unknown",
      reason: counted.reason,
      count: counted.count,
    })),
  };
}

export function historyFromProto(message: pb.CacheHistory | undefined): CacheHistory {
  return {
    key: message?.key ?? "",
    reports: Number(message?.reports ?? 0),
    breaks: Number(message?.breaks ?? 0),
    breakers: (message?.breakers ?? []).map((b) => [b.part, Number(b.count)]),
    recomputed: sizeFromProto(message?.recomputed),
    recent: (message?.recent ?? []).map(entryFromProto),
    evicted: message?.evicted ?? false,
  };
}

function optional(value: bigint | undefined): number | undefined {
  return value === undefined ? undefined : Number(value);
}
