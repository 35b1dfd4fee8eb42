package dsp_test

import (
	"context"
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// CacheHistory and ReportUsage: a history key's prompt-cache history, and what
// the model server said about the latest reported request, on a real sidecar, and
// UsageFromJSON, which needs none (keys of each test's own, as the shared sidecar
// keeps every key's history).

func TestUsageIsReadFromEachModelServersUsageObject(t *testing.T) {
	count := func(n uint64) *uint64 { return &n }
	cases := []struct {
		usage  string
		cached uint64
		prompt *uint64 // nil: not known
	}{
		{`{"prompt_tokens": 1200, "prompt_cache_hit_tokens": 1024, "prompt_cache_miss_tokens": 176}`, 1024, count(1200)}, // DeepSeek
		{`{"prompt_cache_hit_tokens": 1024, "prompt_cache_miss_tokens": 176}`, 1024, count(1200)},
		{`{"prompt_cache_hit_tokens": 1024, "prompt_tokens": null}`, 1024, nil},
		{`{"input_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 5}`, 1000, count(1025)}, // Anthropic
		{`{"input_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": null}`, 1000, count(1020)},
		{`{"cache_read_input_tokens": 1000}`, 1000, nil},
		{`{"prompt_tokens": 1500, "prompt_tokens_details": {"cached_tokens": 1280}}`, 1280, count(1500)}, // OpenAI
		{`{"input_tokens": 900, "input_tokens_details": {"cached_tokens": 512}, "prompt_tokens_details": null}`, 512, count(900)},
		{`{"prompt_tokens_details": {"cached_tokens": 0}}`, 0, nil},
	}
	for _, c := range cases {
		usage, err := dsp.UsageFromJSON([]byte(c.usage))
		if err != nil {
			t.Fatalf("%s: %v", c.usage, err)
		}
		if usage.CachedTokens != c.cached || (usage.PromptTokens == nil) != (c.prompt == nil) ||
			(usage.PromptTokens != nil && *usage.PromptTokens != *c.prompt) {
			t.Errorf("%s: %d cached, %v prompt tokens", c.usage, usage.CachedTokens, usage.PromptTokens)
		}
	}
}

func TestUsageWithoutWholeTokenCountsIsRefusedInTheClient(t *testing.T) {
	cases := map[string]string{
		`{"total_tokens": 9}`:               "usage has no cached-token figure (prompt_cache_hit_tokens, cache_read_input_tokens or prompt_tokens_details.cached_tokens)",
		`[1]`:                               "usage must be a JSON object, not [1]",
		`null`:                              "usage must be a JSON object, not null",
		`{"prompt_cache_hit_tokens": -1}`:   "usage token counts must be whole numbers >= 0, not -1",
		`{"prompt_cache_hit_tokens": 1.5}`:  "usage token counts must be whole numbers >= 0, not 1.5",
		`{"prompt_cache_hit_tokens": "3"}`:  `usage token counts must be whole numbers >= 0, not "3"`,
		`{"prompt_cache_hit_tokens": null}`: "usage token counts must be whole numbers >= 0, not null",
		`{"cache_read_input_tokens": 1, "input_tokens": true}`:                 "usage token counts must be whole numbers >= 0, not true",
		`{"prompt_tokens_details": {"cached_tokens": 1}, "prompt_tokens": -2}`: "usage token counts must be whole numbers >= 0, not -2",
	}
	for usage, message := range cases {
		_, err := dsp.UsageFromJSON([]byte(usage))
		if err == nil {
			t.Errorf("%s: read", usage)
			continue
		}
		if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue || failed.Message != message {
			t.Errorf("%s: %+v", usage, failed)
		}
	}
}

func TestTheHistoryCountsBreaksAndNamesThePartThatBrokeIt(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-history-clock"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "clock", 30, func(_ context.Context, a dsp.AssembleContext) (string, error) {
		return "Now: " + a.Get("now").(string) + ".", nil
	}))
	var recomputed uint64
	for _, now := range []string{"10:00", "10:01", "10:02"} {
		report := reportOf(t, client, dsp.ForScope("go-history-clock"), dsp.WithFields(map[string]any{"now": now}))
		recomputed += report.Stability.Recomputed.Bytes
	}
	// An assembly that asks for no report is not counted.
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-history-clock"), dsp.WithFields(map[string]any{"now": "11:00"})))

	history := must[*dsp.CacheHistory](t)(client.CacheHistory(bg, "go-history-clock", ""))
	if history.Key != `scope "go-history-clock"` || history.Reports != 3 || history.Breaks != 2 || history.Evicted {
		t.Fatalf("the history: %+v", history)
	}
	equal(t, history.Breakers, []dsp.PartBreaks{{Part: `section "clock"`, Count: 2}})
	if history.Recomputed.Bytes != recomputed || recomputed == 0 || history.Recomputed.Tokens != nil {
		t.Fatalf("recomputed %+v, the reports' %d", history.Recomputed, recomputed)
	}
	if len(history.Recent) != 3 {
		t.Fatalf("the recent reports: %+v", history.Recent)
	}
	first, last := history.Recent[0], history.Recent[2]
	if first.Sequence != 1 || first.HasPrevious || first.FirstChanged != "" || first.PrefixLayout != dsp.PrefixLayoutSystemFirst {
		t.Fatalf("the first entry: %+v", first)
	}
	if last.Sequence != 3 || !last.HasPrevious || last.FirstChanged != `section "clock"` || last.Reason != `section "clock" text changed` ||
		last.Revision == 0 || last.StableBytes == 0 || last.Prefix.Bytes != last.StableBytes+last.Recomputed.Bytes ||
		last.ObservedCachedTokens != nil || last.SkippedCounts != nil {
		t.Fatalf("the last entry: %+v", last)
	}
}

func TestReportUsageAttachesWhatTheModelServerSaidToTheLatestReport(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-history-usage"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "rules", 10, "Be precise."))
	for i := 0; i < 2; i++ {
		reportOf(t, client, dsp.ForScope("go-history-usage"), dsp.WithReportKey("go-usage-conv"))
	}
	usage := must[dsp.Usage](t)(dsp.UsageFromJSON([]byte(`{"prompt_tokens": 1500, "prompt_tokens_details": {"cached_tokens": 1280}}`)))
	entry := must[*dsp.CacheHistoryEntry](t)(client.ReportUsage(bg, "go-history-usage", "go-usage-conv", usage))
	if entry.Sequence != 2 || !entry.HasPrevious || entry.ObservedCachedTokens == nil || *entry.ObservedCachedTokens != 1280 ||
		entry.ObservedPromptTokens == nil || *entry.ObservedPromptTokens != 1500 {
		t.Fatalf("the entry: %+v", entry)
	}
	history := must[*dsp.CacheHistory](t)(client.CacheHistory(bg, "", "go-usage-conv"))
	if history.Key != `key "go-usage-conv"` || history.Reports != 2 || len(history.Recent) != 2 {
		t.Fatalf("the history: %+v", history)
	}
	if older, latest := history.Recent[0], history.Recent[1]; older.ObservedCachedTokens != nil ||
		latest.ObservedCachedTokens == nil || *latest.ObservedCachedTokens != 1280 {
		t.Fatalf("the entries: %+v", history.Recent)
	}
	if scoped := must[*dsp.CacheHistory](t)(client.CacheHistory(bg, "go-history-usage", "")); scoped.Reports != 0 {
		t.Fatalf("the scope's own history counts the key's reports: %+v", scoped)
	}
}

func TestUsageForAKeyNeverReportedIsNotFound(t *testing.T) {
	client := connect(t, shared(t))
	_, err := client.ReportUsage(bg, "go-history-nobody", "", dsp.Usage{CachedTokens: 1})
	if failed := failure(t, err); failed.Code != codes.NotFound || failed.Reason != dsp.ReasonReportNotFound ||
		!strings.Contains(failed.Message, `no reported assembly for scope "go-history-nobody"`) {
		t.Fatalf("the failure: %+v", failed)
	}
}

func TestAHistoryEntryCountsTheStepsItsAssemblySkipped(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-history-skipped"))
	for _, name := range []string{"probe-1", "probe-2"} {
		must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, name, 20, brokenText, ignore))
	}
	reportOf(t, client, dsp.ForScope("go-history-skipped"))
	history := must[*dsp.CacheHistory](t)(client.CacheHistory(bg, "go-history-skipped", ""))
	if len(history.Recent) != 1 {
		t.Fatalf("the history: %+v", history)
	}
	equal(t, history.Recent[0].SkippedCounts, []dsp.SkippedCount{{Kind: "section", Reason: dsp.ReasonProviderFailed, Count: 2}})
}
