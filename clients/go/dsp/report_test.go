package dsp_test

import (
	"context"
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// WithReport: the prompt-cache report of an assembly (docs/prompt-cache.md), on
// a real sidecar. Each test reports under scopes or keys of its own, as the
// shared sidecar keeps every key's history.

func reportOf(t *testing.T, client *dsp.Client, opts ...dsp.AssembleOption) dsp.AssemblyReport {
	t.Helper()
	var report dsp.AssemblyReport
	must[*dsp.Assembly](t)(client.Assemble(bg, append(opts, dsp.WithReport(&report))...))
	return report
}

func partOf(t *testing.T, report dsp.AssemblyReport, kind dsp.PartKind, name string) dsp.PartReport {
	t.Helper()
	for _, part := range report.Parts {
		if part.Kind == kind && part.Name == name {
			return part
		}
	}
	t.Fatalf("no %s %q in %+v", kind, name, report.Parts)
	return dsp.PartReport{}
}

func TestAReportNamesThePartThatBrokeThePrefixAndWhy(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-report-clock"))
	clock := must[*dsp.Handle[string]](t)(scope.Section(bg, "clock", 20, "It is 10:00."))

	first := reportOf(t, client, dsp.ForScope("go-report-clock"))
	if first.Stability.HasPrevious || first.Stability.Reason != "" || first.HistoryKey != `scope "go-report-clock"` ||
		first.PrefixLayout != dsp.PrefixLayoutSystemFirst || first.Tokenizer != "" {
		t.Fatalf("the first report: %+v", first)
	}
	part := partOf(t, first, "section", "clock")
	want := dsp.Source{Kind: "scope", Scope: "go-report-clock", Description: `scope "go-report-clock"`}
	if part.Source != want || part.Bytes != uint64(len("It is 10:00.")) || len(part.Fingerprint) != 16 ||
		part.Tokens != nil || part.Stable {
		t.Fatalf("the clock's part: %+v", part)
	}
	if partOf(t, first, "section", "harness:identity").Source.Kind != "builtin" {
		t.Fatalf("the identity's source: %+v", first.Parts)
	}

	must[uint64](t)(clock.Update(bg, "It is 10:01."))
	second := reportOf(t, client, dsp.ForScope("go-report-clock"))
	s := second.Stability
	if !s.HasPrevious || s.FirstChanged != `section "clock"` || s.Reason != `section "clock" text changed` ||
		!s.MessagesRecomputed || s.Diff != "-It is 10:00.\n+It is 10:01." || s.Recomputed.Bytes == 0 ||
		s.StableBytes == 0 || s.StableBytes+s.Recomputed.Bytes != s.Prefix.Bytes {
		t.Fatalf("the second report's stability: %+v", s)
	}
	if !partOf(t, second, "section", "harness:identity").Stable || partOf(t, second, "section", "clock").Stable {
		t.Fatalf("the second report's parts: %+v", second.Parts)
	}
}

func TestAReportKeyIsComparedWithItsOwnHistory(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-report-keyed"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "rules", 10, "Be precise."))
	reportOf(t, client, dsp.ForScope("go-report-keyed"))

	keyed := reportOf(t, client, dsp.ForScope("go-report-keyed"), dsp.WithReportKey("go-conv-1"))
	if keyed.Stability.HasPrevious || keyed.HistoryKey != `key "go-conv-1"` {
		t.Fatalf("the key's first report: %+v", keyed)
	}
	again := reportOf(t, client, dsp.ForScope("go-report-keyed"), dsp.WithReportKey("go-conv-1"))
	if !again.Stability.HasPrevious || again.Stability.FirstChanged != "" || again.Stability.Recomputed.Bytes != 0 {
		t.Fatalf("the key's second report: %+v", again.Stability)
	}
}

func TestAReportIsMeasuredInTheLayoutAskedFor(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-report-layout"))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "read"}}}))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "rules", 10, "Be precise."))
	kinds := func(report dsp.AssemblyReport) (first, last dsp.PartKind) {
		if len(report.Parts) == 0 {
			t.Fatalf("no parts: %+v", report)
		}
		return report.Parts[0].Kind, report.Parts[len(report.Parts)-1].Kind
	}
	toolsFirst := reportOf(t, client, dsp.ForScope("go-report-layout"), dsp.WithPrefixLayout(dsp.PrefixLayoutToolsFirst))
	if first, last := kinds(toolsFirst); toolsFirst.PrefixLayout != dsp.PrefixLayoutToolsFirst || first != "tool" || last != "section" {
		t.Fatalf("tools first: %s %+v", toolsFirst.PrefixLayout, toolsFirst.Parts)
	}
	systemFirst := reportOf(t, client, dsp.ForScope("go-report-layout"), dsp.WithPrefixLayout(dsp.PrefixLayoutSystemFirst))
	if first, last := kinds(systemFirst); systemFirst.PrefixLayout != dsp.PrefixLayoutSystemFirst || first != "section" || last != "tool" {
		t.Fatalf("system first: %s %+v", systemFirst.PrefixLayout, systemFirst.Parts)
	}
	if toolsFirst.Tools.Bytes == 0 || toolsFirst.Tools != systemFirst.Tools || toolsFirst.Prompt != systemFirst.Prompt {
		t.Fatalf("the sizes: %+v / %+v", toolsFirst, systemFirst)
	}

	_, err := client.Assemble(bg, dsp.WithReport(&dsp.AssemblyReport{}), dsp.WithPrefixLayout("sideways"))
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue ||
		failed.Message != `prefix layout must be "system-first" or "tools-first", not "sideways"` {
		t.Fatalf("the refusal: %+v", failed)
	}
	_, err = client.Assemble(bg, dsp.WithReport(nil))
	if failed := failure(t, err); failed.Reason != dsp.ReasonInvalidValue {
		t.Fatalf("WithReport(nil): %+v", failed)
	}
}

func TestARenderedReportSaysWhereVariablesCameFromAndWhatWasSkipped(t *testing.T) {
	client := connect(t, shared(t))
	team := must[*dsp.Scope](t)(client.Scope(bg, "go-report-team"))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-report-agent", dsp.WithParent("go-report-team")))
	must[*dsp.VariableHandle](t)(team.Variable(bg, "model", "team-model"))
	must[*dsp.Handle[string]](t)(agent.Section(bg, "rules", 10, "Rules for {{model}}."))
	must[*dsp.Handle[string]](t)(agent.SectionFunc(bg, "cwd", 20, brokenText, ignore))
	var report dsp.AssemblyReport
	rendered := must[*dsp.Rendered](t)(client.Render(bg, dsp.ForScope("go-report-agent"), dsp.WithReport(&report)))
	if report.Prompt.Bytes != uint64(len(rendered.Prompt)) || report.RenderError != "" {
		t.Fatalf("the prompt's size %d, rendered %d bytes; render error %q", report.Prompt.Bytes, len(rendered.Prompt), report.RenderError)
	}
	var model *dsp.VariableReport
	for i := range report.Variables {
		if report.Variables[i].Name == "model" {
			model = &report.Variables[i]
		}
	}
	want := dsp.Source{Kind: "scope", Scope: "go-report-team", AncestorDepth: 1, Description: `scope "go-report-team" (ancestor of "go-report-agent")`}
	if model == nil || model.Source != want {
		t.Fatalf("the variables: %+v", report.Variables)
	}
	if len(report.Skipped) != 1 || report.Skipped[0].Name != "cwd" || report.Skipped[0].Reason != dsp.ReasonProviderFailed ||
		report.Skipped[0].Scope != "go-report-agent" {
		t.Fatalf("the report's skipped steps: %+v", report.Skipped)
	}
}

func TestAReportOfAnAssemblyThatDoesNotRenderNamesTheFailingPart(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-report-unrendered"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "broken", 10, func(context.Context, dsp.AssembleContext) (string, error) {
		return "Use {{nowhere}}.", nil
	}))
	report := reportOf(t, client, dsp.ForScope("go-report-unrendered"))
	if !strings.Contains(report.RenderError, `section "broken"`) || partOf(t, report, "section", "broken").Bytes != uint64(len("Use {{nowhere}}.")) {
		t.Fatalf("the render error %q, parts %+v", report.RenderError, report.Parts)
	}
}
