// Prompt-cache history: CacheHistory, ReportUsage and UsageFromJSON.

package dsp

import (
	"bytes"
	"context"
	"encoding/json"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc"
)

// The prompt-cache history of a history key (docs/prompt-cache.md, "How
// often: the history"), and what the model server said about a request.

// CacheHistory is how often the prefix broke for one history key, which parts
// broke it, and what it cost, since the sidecar started (or the key was evicted).
type CacheHistory struct {
	// Key is the key in words: `scope "agent-1"`, `key "conv-7"`.
	Key string
	// Reports is how many assemblies were reported; Breaks how many of them broke the prefix.
	Reports, Breaks uint64
	// Breakers are the parts that broke it, most breaks first.
	Breakers []PartBreaks
	// Recomputed is the prefix recomputed in total because of breaks.
	Recomputed Size
	// Recent are the latest reports, oldest first (at most the sidecar's report_history).
	Recent []CacheHistoryEntry
	// Evicted is true when the key's earlier history was evicted to make room for others.
	Evicted bool
}

// PartBreaks is how many times one part broke the prefix.
type PartBreaks struct {
	// Part is the part, e.g. `section "clock"`.
	Part  string
	Count uint64
}

// CacheHistoryEntry is one reported assembly: the predicted stable prefix, and
// what the model server observed (ReportUsage).
type CacheHistoryEntry struct {
	// Sequence is 1 for the key's first report, counting up.
	Sequence uint64
	// Revision is the registry's revision the assembly was taken at.
	Revision     uint64
	PrefixLayout PrefixLayout
	// HasPrevious is false when there was nothing to compare it with.
	HasPrevious bool
	// FirstChanged is the first changed part, "" when the prefix held; Reason is why.
	FirstChanged, Reason string
	// Prefix is the whole prefix's size.
	Prefix Size
	// StableBytes is the predicted common prefix with the previous report, in bytes.
	StableBytes uint64
	// StableTokens is the same in tokens (what the server should read from its
	// cache); nil without a tokenizer.
	StableTokens *uint64
	// Recomputed is what the break made the model server recompute of the prefix.
	Recomputed Size
	// ObservedCachedTokens and ObservedPromptTokens are what the model server
	// said (ReportUsage); nil until told.
	ObservedCachedTokens, ObservedPromptTokens *uint64
	// SkippedCounts count the steps the assembly went on without, by kind and
	// reason, in the order each pair was first skipped; nil when it was complete.
	SkippedCounts []SkippedCount
}

// SkippedCount is how many steps of one kind one reported assembly skipped for one reason.
type SkippedCount struct {
	// Kind is as SkippedStep.Kind; Reason as SkippedStep.Reason.
	Kind   ChangeKind
	Reason Reason
	// Count is at least 1.
	Count uint32
}

// Usage is what a model server said about a request's prompt tokens.
type Usage struct {
	// CachedTokens are the prompt tokens the server read from its cache.
	CachedTokens uint64
	// PromptTokens are all prompt tokens of the request, cached or not; nil when unknown.
	PromptTokens *uint64
}

// CacheHistory returns the prompt-cache history of reportKey, or of scope when
// reportKey is "" (the history keys WithReportKey and ForScope name).
func (c *Client) CacheHistory(ctx context.Context, scope, reportKey string) (*CacheHistory, error) {
	request := &pb.GetCacheHistoryRequest{Scope: scope, ReportKey: reportKey}
	reply, err := unary(ctx, c.c, "GetCacheHistory", c.c.rpc.GetCacheHistory, request)
	if err != nil {
		return nil, err
	}
	h := reply.GetHistory()
	history := &CacheHistory{
		Key: h.GetKey(), Reports: h.GetReports(), Breaks: h.GetBreaks(),
		Breakers: make([]PartBreaks, len(h.GetBreakers())), Recomputed: sizeFromProto(h.GetRecomputed()),
		Recent: make([]CacheHistoryEntry, len(h.GetRecent())), Evicted: h.GetEvicted(),
	}
	for i, b := range h.GetBreakers() {
		history.Breakers[i] = PartBreaks{Part: b.GetPart(), Count: b.GetCount()}
	}
	for i, entry := range h.GetRecent() {
		history.Recent[i] = entryFromProto(entry)
	}
	return history, nil
}

// ReportUsage tells the sidecar what the model server said about the request
// of the latest report of reportKey (or of scope when reportKey is ""), and
// returns that report's entry with it; a key with no report is NOT_FOUND,
// ReasonReportNotFound. UsageFromJSON reads a model server's usage object.
func (c *Client) ReportUsage(ctx context.Context, scope, reportKey string, usage Usage) (*CacheHistoryEntry, error) {
	request := &pb.ReportUsageRequest{
		Scope: scope, ReportKey: reportKey, CachedTokens: usage.CachedTokens, PromptTokens: usage.PromptTokens,
	}
	reply, err := unary(ctx, c.c, "ReportUsage", c.c.rpc.ReportUsage, request)
	if err != nil {
		return nil, err
	}
	entry := entryFromProto(reply.GetEntry())
	return &entry, nil
}

// unary makes one call the sidecar answers at once, bounded by the call timeout.
func unary[Q, A any](ctx context.Context, c *conn, what string, call func(context.Context, Q, ...grpc.CallOption) (A, error), request Q) (A, error) {
	var none A
	if _, err := c.ready(ctx); err != nil {
		return none, err
	}
	callCtx, cancel := bounded(ctx, c.callTimeout)
	defer cancel()
	reply, err := call(callCtx, request)
	if err != nil {
		return none, answerError(callCtx, err, what)
	}
	return reply, nil
}

func entryFromProto(m *pb.CacheHistoryEntry) CacheHistoryEntry {
	entry := CacheHistoryEntry{
		Sequence: m.GetSequence(), Revision: m.GetRevision(), PrefixLayout: layoutFromProto(m.GetPrefixLayout()),
		HasPrevious: m.GetHasPrevious(), FirstChanged: m.GetFirstChanged(), Reason: m.GetReason(),
		Prefix: sizeFromProto(m.GetPrefix()), StableBytes: m.GetStableBytes(), Recomputed: sizeFromProto(m.GetRecomputed()),
	}
	if m != nil {
		entry.StableTokens = optional(m.StableTokens)
		entry.ObservedCachedTokens, entry.ObservedPromptTokens = optional(m.ObservedCachedTokens), optional(m.ObservedPromptTokens)
	}
	for _, counted := range m.GetSkippedCounts() {
		entry.SkippedCounts = append(entry.SkippedCounts, SkippedCount{
			Kind: kindFromProto(counted.GetKind()), Reason: Reason(counted.GetReason()), Count: counted.GetCount(),
		})
	}
	return entry
}

// UsageFromJSON reads the cached and prompt tokens of a model server's usage
// object, as JSON: DeepSeek's prompt_cache_hit_tokens (+ prompt_cache_miss_tokens
// or prompt_tokens), Anthropic's cache_read_input_tokens (+ cache_creation_input_tokens
// and input_tokens, which excludes cache reads), OpenAI's prompt_tokens_details.cached_tokens
// (or input_tokens_details in the Responses API), Gemini's usageMetadata
// promptTokenCount (+ cachedContentTokenCount). Anything else is INVALID_VALUE.
func UsageFromJSON(data []byte) (Usage, error) {
	var usage map[string]json.RawMessage
	if err := json.Unmarshal(data, &usage); err != nil || usage == nil {
		return Usage{}, invalid("usage must be a JSON object, not %s", bytes.TrimSpace(data))
	}
	if hit, ok := usage["prompt_cache_hit_tokens"]; ok { // DeepSeek
		if total := usage["prompt_tokens"]; present(total) {
			return usageOf(hit, total)
		}
		if miss, ok := usage["prompt_cache_miss_tokens"]; ok {
			return usageOf(hit, hit, miss)
		}
		return usageOf(hit)
	}
	if read, ok := usage["cache_read_input_tokens"]; ok { // Anthropic
		if _, ok := usage["input_tokens"]; !ok {
			return usageOf(read)
		}
		written := usage["cache_creation_input_tokens"]
		if !present(written) {
			written = json.RawMessage("0") // no cache write reported
		}
		return usageOf(read, read, written, usage["input_tokens"])
	}
	if total := usage["promptTokenCount"]; present(total) { // Gemini's usageMetadata
		cached := usage["cachedContentTokenCount"]
		if !present(cached) {
			cached = json.RawMessage("0") // left out when nothing was cached
		}
		return usageOf(cached, total)
	}
	for _, names := range [][2]string{{"prompt_tokens_details", "prompt_tokens"}, {"input_tokens_details", "input_tokens"}} {
		var details map[string]json.RawMessage // OpenAI: chat completions, then responses
		if json.Unmarshal(usage[names[0]], &details) != nil {
			continue
		}
		if cached, ok := details["cached_tokens"]; ok {
			if total := usage[names[1]]; present(total) {
				return usageOf(cached, total)
			}
			return usageOf(cached)
		}
	}
	return Usage{}, invalid("usage has no cached-token figure (prompt_cache_hit_tokens, cache_read_input_tokens" +
		" or prompt_tokens_details.cached_tokens)")
}

// usageOf is the cached tokens and, when any are given, the prompt's: the sum of prompt.
func usageOf(cached json.RawMessage, prompt ...json.RawMessage) (Usage, error) {
	n, err := tokens(cached)
	usage := Usage{CachedTokens: n}
	if err != nil || len(prompt) == 0 {
		return usage, err
	}
	var sum uint64
	for _, part := range prompt {
		n, err := tokens(part)
		if err != nil {
			return Usage{}, err
		}
		sum += n
	}
	usage.PromptTokens = &sum
	return usage, nil
}

func present(value json.RawMessage) bool {
	return value != nil && string(bytes.TrimSpace(value)) != "null"
}

// tokens is a whole number >= 0, as the wire's counts are (JSON's 1.0 and -1 are not).
func tokens(value json.RawMessage) (uint64, error) {
	var n uint64
	if !present(value) || json.Unmarshal(value, &n) != nil { // null would decode as 0
		shown := string(bytes.TrimSpace(value))
		if value == nil {
			shown = "absent"
		}
		return 0, invalid("usage token counts must be whole numbers >= 0, not %s", shown)
	}
	return n, nil
}
