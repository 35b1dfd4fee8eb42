package dsp_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// WithFailurePolicy: a provider or listener under FailurePolicyIgnore that fails is
// skipped, and the assembly names the step it went on without (docs/protocol.md,
// "Failure policy"), on a real sidecar.

var ignore = dsp.WithFailurePolicy(dsp.FailurePolicyIgnore)

func brokenText(context.Context, dsp.AssembleContext) (string, error) {
	return "", errors.New("no cwd here")
}

func TestAnIgnoredProviderThatFailsIsSkippedAndNamed(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "Be precise."))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "cwd", 20, brokenText, ignore))
	var skipped []dsp.SkippedStep
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithSkipped(&skipped)))
	if text(assembly, "cwd") != "<absent>" || text(assembly, "rules") != "Be precise." {
		t.Fatalf("the sections: %v", names(assembly.Sections))
	}
	if len(skipped) != 1 {
		t.Fatalf("skipped: %+v", skipped)
	}
	step := skipped[0]
	if step.Kind != "section" || step.Name != "cwd" || step.Scope != "" || step.Ref == "" ||
		step.Reason != dsp.ReasonProviderFailed || !strings.Contains(step.Message, "no cwd here") {
		t.Fatalf("the skipped step: %+v", step)
	}
}

func TestAnIgnoredListenerThatFailsIsPassedOverAndTheNextOneRuns(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(context.Context, *dsp.Assembly, dsp.AssembleContext, *dsp.Next) (*dsp.Assembly, error) {
		return nil, errors.New("no weather today")
	}, dsp.ListenerName("weather"), ignore))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "signature", Text: "-- the team"})
		return next.Tail(a)
	}))
	rendered := must[*dsp.Rendered](t)(client.Render(bg))
	if !strings.HasSuffix(rendered.Prompt, "-- the team") {
		t.Fatalf("the prompt: %q", rendered.Prompt)
	}
	if len(rendered.Skipped) != 1 || rendered.Skipped[0].Kind != "listener" || rendered.Skipped[0].Name != "weather" ||
		rendered.Skipped[0].Reason != dsp.ReasonListenerFailed {
		t.Fatalf("skipped: %+v", rendered.Skipped)
	}
}

func TestACompleteAssemblyHasNoSkippedSteps(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "Be precise."))
	skipped := []dsp.SkippedStep{{Name: "left over"}}
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithSkipped(&skipped)))
	if skipped != nil {
		t.Fatalf("skipped: %+v", skipped)
	}
}

func TestAProviderUnderFailStillFailsTheAssembly(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "cwd", 20, brokenText, dsp.WithFailurePolicy(dsp.FailurePolicyFail)))
	_, err := client.Assemble(bg)
	if failed := failure(t, err); failed.Reason != dsp.ReasonProviderFailed {
		t.Fatalf("the failure: %+v", failed)
	}
}

func TestWithFailurePolicyOnAStaticValueOrNotAPolicyIsRefused(t *testing.T) {
	client := connect(t, shared(t))
	_, err := client.Section(bg, "static", 1, "text", ignore)
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue ||
		failed.Message != "WithFailurePolicy applies to a provider (a ...Func registration), not to a static value" {
		t.Fatalf("the refusal: %+v", failed)
	}
	_, err = client.SectionFunc(bg, "cwd", 1, brokenText, dsp.WithFailurePolicy("sometimes"))
	if failed := failure(t, err); failed.Reason != dsp.ReasonInvalidValue || !strings.Contains(failed.Message, `not "sometimes"`) {
		t.Fatalf("the refusal: %+v", failed)
	}
}
