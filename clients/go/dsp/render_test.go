package dsp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// Local rendering agrees with the sidecar's, text for text and error for
// error: each case is a dynamic section and context (a static text with a
// malformed reference is refused at registration), rendered both ways.
func TestLocalRenderingAgreesWithTheSidecars(t *testing.T) {
	client := connect(t, shared(t))
	cases := []string{
		"Plain.", "", "Use {{model}} and {{model}}.", "{{ model }}", "{{}}", "{{{model}}}",
		"open {{ never closed", "{{modle}}", "{{constructor}}", "{{cwd}}", "{{braces}} stays",
		"a {{b}c}} d", `quote {{ x" y }}`, "{{{" + strings.Repeat("ä", 50) + "}}}", "ünï {{model}}}",
	}
	failed := 0
	for i, text := range cases {
		key := fmt.Sprintf("go-render-%d", i)
		scope := must[*dsp.Scope](t)(client.Scope(bg, key))
		must[*dsp.VariableHandle](t)(scope.Variable(bg, "model", "m"))
		must[*dsp.VariableHandle](t)(scope.VariableUnset(bg, "cwd"))
		must[*dsp.VariableHandle](t)(scope.Variable(bg, "braces", "{{model}}"))
		provide := func(context.Context, dsp.AssembleContext) (string, error) { return text, nil }
		must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "case", 1, provide))
		must[*dsp.Handle[string]](t)(scope.Section(bg, "after", 2, "After."))
		must[*dsp.Handle[string]](t)(scope.ContextFunc(bg, "case", 1, provide))

		assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope(key)))
		prompt, promptErr := dsp.RenderPrompt(assembly)
		snapshot, snapshotErr := dsp.RenderContextSnapshot(assembly)
		rendered, err := client.Render(bg, dsp.ForScope(key))
		switch {
		case err == nil && promptErr == nil && snapshotErr == nil:
			if prompt != rendered.Prompt || snapshot != rendered.ContextSnapshot {
				t.Errorf("%q: locally %q / %q, on the sidecar %q / %q", text, prompt, snapshot, rendered.Prompt, rendered.ContextSnapshot)
			}
		case err != nil && promptErr != nil:
			failed++
			local, remote := failure(t, promptErr), failure(t, err)
			if local.Message != remote.Message || local.Reason != dsp.ReasonRenderFailed || local.Code != codes.FailedPrecondition {
				t.Errorf("%q: locally %v %s %q, on the sidecar %q", text, local.Code, local.Reason, local.Message, remote.Message)
			}
			if snapshotErr == nil || failure(t, snapshotErr).Message != strings.Replace(local.Message, `section "case"`, `context "case"`, 1) {
				t.Errorf("%q: the context's error: %v", text, snapshotErr)
			}
		default:
			t.Errorf("%q: locally %v / %v, on the sidecar %v", text, promptErr, snapshotErr, err)
		}
	}
	if failed != 9 {
		t.Fatalf("%d of the cases fail to render, want 9", failed)
	}
}

func TestRenderingAnEmptyAssembly(t *testing.T) {
	empty := &dsp.Assembly{}
	if prompt, err := dsp.RenderPrompt(empty); prompt != "" || err != nil {
		t.Fatalf("%q %v", prompt, err)
	}
	if snapshot, err := dsp.RenderContextSnapshot(empty); snapshot != "" || err != nil {
		t.Fatalf("%q %v", snapshot, err)
	}
	_, err := dsp.RenderPrompt(&dsp.Assembly{Sections: []dsp.Part{{Name: "s", Text: "{{x}}"}}})
	if failure(t, err).Message != `unknown prompt variable "{{x}}" in section "s"; registered variables: (none)` {
		t.Fatalf("no variables: %v", err)
	}
}
