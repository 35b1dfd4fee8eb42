package dsp_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// WatchPrompt: a scope's prompt from its static parts, now and after each burst
// of changes, with the prompt-cache verdict (docs/protocol.md, "Live prompts"),
// on a real sidecar.

func nextPrompt(t *testing.T, prompts *dsp.PromptStream) *dsp.PromptChange {
	t.Helper()
	return must[*dsp.PromptChange](t)(prompts.Next(within(t, 15*time.Second)))
}

func TestAWatchedPromptComesNowThenAfterEachChangeWithItsCacheVerdict(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-watched"))
	rules := must[*dsp.Handle[string]](t)(scope.Section(bg, "rules", 10, "Be precise."))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "cwd", 20, func(context.Context, dsp.AssembleContext) (string, error) {
		t.Error("a watched prompt asked a provider")
		return "", nil
	}))
	prompts := must[*dsp.PromptStream](t)(client.WatchPrompt(bg, "go-watched", dsp.WithRendering()))
	defer prompts.Close()

	first := nextPrompt(t, prompts)
	if first.Revision == 0 || first.Incarnation == "" || first.Error != "" || first.Changes != nil ||
		first.Report == nil || first.Report.Stability.HasPrevious || first.Report.HistoryKey == "" {
		t.Fatalf("the first prompt: %+v", first)
	}
	if text(first.Assembly, "rules") != "Be precise." || text(first.Assembly, "cwd") != `<dynamic section "cwd">` {
		t.Fatalf("the first prompt's sections: %+v", first.Assembly.Sections)
	}
	if first.Prompt == nil || !strings.Contains(*first.Prompt, "Be precise.\n\n<dynamic section \"cwd\">") || first.ContextSnapshot == nil {
		t.Fatalf("the first prompt, rendered: %v", first.Prompt)
	}

	revision := must[uint64](t)(rules.Update(bg, "Be exact."))
	second := nextPrompt(t, prompts)
	if second.Revision != revision || len(second.Changes) != 1 || text(second.Assembly, "rules") != "Be exact." {
		t.Fatalf("the second prompt at %d: %+v", revision, second)
	}
	change := second.Changes[0]
	if change.Revision != revision || change.Kind != "section" || change.Action != "updated" || change.Name != "rules" || change.Scope != "go-watched" {
		t.Fatalf("the change: %+v", change)
	}
	s := second.Report.Stability
	if !s.HasPrevious || s.FirstChanged != `section "rules"` || s.Reason != `section "rules" text changed` || !s.MessagesRecomputed {
		t.Fatalf("the verdict: %+v", s)
	}
}

func TestAWatchedPromptThatDoesNotAssembleSaysWhy(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-watched-twice-complete"))
	for _, name := range []string{"one", "two"} {
		must[*dsp.Handle[string]](t)(scope.Section(bg, name, 1, "All of it.", dsp.Complete()))
	}
	prompts := must[*dsp.PromptStream](t)(client.WatchPrompt(bg, "go-watched-twice-complete"))
	defer prompts.Close()
	first := nextPrompt(t, prompts)
	if first.Error == "" || first.Assembly != nil || first.Prompt != nil {
		t.Fatalf("the prompt: %+v", first)
	}
}

func TestAWatchedPromptIsMeasuredInTheLayoutAskedFor(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-watched-layout"))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "read"}}}))
	prompts := must[*dsp.PromptStream](t)(client.WatchPrompt(bg, "go-watched-layout", dsp.WithLayout(dsp.PrefixLayoutToolsFirst)))
	defer prompts.Close()
	first := nextPrompt(t, prompts)
	if first.Report.PrefixLayout != dsp.PrefixLayoutToolsFirst || first.Report.Parts[0].Kind != "tool" || first.Prompt != nil {
		t.Fatalf("the prompt: %+v", first.Report)
	}
	_, err := client.WatchPrompt(bg, "go-watched-layout", dsp.WithLayout("sideways"))
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue ||
		!strings.Contains(failed.Message, `not "sideways"`) {
		t.Fatalf("the refusal: %+v", failed)
	}
}

func TestAClosedPromptStreamAndOneOfAClosedClientEnd(t *testing.T) {
	client, err := dsp.Connect(bg, shared(t).address)
	check(t, err)
	prompts := must[*dsp.PromptStream](t)(client.WatchPrompt(bg, "go-watched-closed"))
	nextPrompt(t, prompts)
	waiting := make(chan error, 1)
	go func() {
		_, err := prompts.Next(within(t, 15*time.Second))
		waiting <- err
	}()
	client.Close()
	if err := <-waiting; !errors.Is(err, io.EOF) {
		t.Fatalf("a Next waiting when the client closed: %v", err)
	}
	if _, err := prompts.Next(within(t, 5*time.Second)); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after: %v", err)
	}

	other := connect(t, shared(t))
	watched := must[*dsp.PromptStream](t)(other.WatchPrompt(bg, "go-watched-closed"))
	watched.Close()
	if _, err := watched.Next(within(t, 5*time.Second)); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after Close, its first prompt unread: %v", err)
	}
}
