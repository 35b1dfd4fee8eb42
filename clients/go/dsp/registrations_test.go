package dsp_test

import (
	"context"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// Register's run of registrations, checked once, and the helpers for the
// common provider shapes, on a real sidecar.

func TestARunOfRegistrationsMakesEachPartAndIsCheckedOnce(t *testing.T) {
	client := connect(t, shared(t))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-run"))
	sign := func(ctx context.Context, a *dsp.Assembly, c dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "signature", Text: "Signed."})
		return next.Tail(a)
	}
	err := agent.Register(bg).
		Section("role", 10, "You review {{language}} code on {{model}}.").
		SectionFunc("task", 20, dsp.Text(func(a dsp.AssembleContext) string {
			task, _ := a.Text("task")
			return "Task: " + task + "."
		})).
		Context("mode", 10, "Mode: strict.").
		ContextFunc("turn", 20, dsp.Text(func(a dsp.AssembleContext) string {
			turn, _ := a.Text("turn")
			return "Turn " + turn + "."
		})).
		Variable("model", "deepseek-v4").
		VariableFunc("language", dsp.FieldVariable("language")).
		Tools(dsp.Schemas(dsp.ToolSchema{Name: "read_file", Description: "Read a file."})).
		ToolsFunc(func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
			return dsp.Schemas(dsp.ToolSchema{Name: "bash"}), nil
		}).
		OnAssemble(sign).
		Err()
	check(t, err)
	fields := map[string]any{"task": "fix it", "language": "Go", "turn": 3}
	rendered := must[*dsp.Rendered](t)(client.Render(bg, dsp.ForScope("go-run"), dsp.WithFields(fields)))
	want := identity + "\n\nYou review Go code on deepseek-v4.\n\nTask: fix it.\n\nSigned."
	if rendered.Prompt != want {
		t.Errorf("prompt %q, want %q", rendered.Prompt, want)
	}
	equal(t, names(rendered.Assembly.Contexts), []string{"mode", "turn"})
	if got := text(rendered.Assembly, "turn"); got != "Turn 3." { // a number field, as text
		t.Errorf("the turn context is %q", got)
	}
	equal(t, toolNames(rendered.Assembly), []string{"bash", "read_file"})

	// Without the field, FieldVariable gives no value: the render names it.
	_, err = client.Render(bg, dsp.ForScope("go-run"), dsp.WithFields(map[string]any{"language": nil}))
	if failure(t, err).Reason != dsp.ReasonRenderFailed {
		t.Errorf("a render without the language field: %v", err)
	}

	// A suppressor through a run, too.
	check(t, agent.Register(bg).SuppressRuntimeContext().Err())
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-run")))
	if len(assembly.Contexts) != 0 {
		t.Errorf("contexts after suppressing them: %v", names(assembly.Contexts))
	}
}

func TestARunStopsAtItsFirstFailureAndKeepsWhatCameBefore(t *testing.T) {
	client := connect(t, shared(t))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-run-failed"))
	err := agent.Register(bg).
		Section("first", 10, "First.").
		Section("first", 20, "The same name again.").
		Section("after", 30, "Never registered.").
		Err()
	if failure(t, err).Reason != dsp.ReasonDuplicateName {
		t.Fatalf("the run's error: %v", err)
	}
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-run-failed")))
	equal(t, names(assembly.Sections), []string{"first"})
	if got := text(assembly, "first"); got != "First." {
		t.Errorf("the first section is %q", got)
	}
}
