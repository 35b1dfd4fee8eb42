package dsp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// WithCallbackTimeout: a provider or listener that declares its own time is
// waited for that long instead of provider_timeout_s (docs/protocol.md,
// "Ejected callbacks"), on a real sidecar whose callbacks have half a second.

var slowCallbacks = []string{"provider_timeout_s = 0.5", "max_callback_timeout_s = 10"}

const slow = 1500 * time.Millisecond // three times provider_timeout_s, half the declared time

var ownTime = dsp.WithCallbackTimeout(3 * time.Second)

func late(ctx context.Context) error {
	select {
	case <-time.After(slow):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func TestProvidersThatDeclareATimeoutAreWaitedForPastProviderTimeout(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	lateText := func(ctx context.Context, _ dsp.AssembleContext) (string, error) { return "late", late(ctx) }
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "slow", 1, lateText, ownTime))
	must[*dsp.Handle[string]](t)(client.ContextFunc(bg, "slow-context", 1, lateText, ownTime))
	must[*dsp.VariableHandle](t)(client.VariableFunc(bg, "slow_variable", func(ctx context.Context, _ dsp.AssembleContext) (string, bool, error) {
		return "late", true, late(ctx)
	}, ownTime))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.ToolsFunc(bg, func(ctx context.Context, _ dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "late_tool", Description: "late", ParametersJSON: "{}"}}}, late(ctx)
	}, ownTime))
	assembly := must[*dsp.Assembly](t)(client.Assemble(within(t, 10*time.Second)))
	variable := "<absent>"
	for _, v := range assembly.Variables {
		if v.Name == "slow_variable" && v.Value != nil {
			variable = *v.Value
		}
	}
	if got := []string{text(assembly, "slow"), text(assembly, "slow-context"), variable}; strings.Join(got, ",") != "late,late,late" {
		t.Fatalf("the slow providers' values: %v", got)
	}
	if tools := toolNames(assembly); len(tools) != 1 || tools[0] != "late_tool" {
		t.Fatalf("the slow tool provider's tools: %v", tools)
	}
}

func TestAListenerThatDeclaresATimeoutIsWaitedForPastProviderTimeout(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		if err := late(ctx); err != nil {
			return nil, err
		}
		a.Sections = append(a.Sections, dsp.Part{Name: "signed", Text: "Late."})
		return next.Tail(a)
	}, ownTime))
	assembly := must[*dsp.Assembly](t)(client.Assemble(within(t, 10*time.Second)))
	if text(assembly, "signed") != "Late." {
		t.Fatalf("the slow listener's section: %v", names(assembly.Sections))
	}
}

func TestATimeoutOverMaxCallbackTimeoutIsRefusedAndLeavesNothing(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	tooLong := dsp.WithCallbackTimeout(11 * time.Second)
	_, err := client.SectionFunc(bg, "s", 1, func(context.Context, dsp.AssembleContext) (string, error) { return "x", nil }, tooLong)
	if failed := wantError(t, err, codes.InvalidArgument, dsp.ReasonValueTooLarge); !strings.Contains(failed.Message, "max_callback_timeout_s") {
		t.Fatalf("the refusal: %s", failed.Message)
	}
	_, err = client.OnAssemble(bg, passThrough, tooLong)
	wantError(t, err, codes.InvalidArgument, dsp.ReasonValueTooLarge)
	listing := must[*dsp.Snapshot](t)(client.Snapshot(bg))
	for _, r := range listing.Registrations {
		if r.Dynamic || r.Kind == "listener" {
			t.Fatalf("a refused registration is left: %+v", r)
		}
	}
}

func TestACallbackTimeoutOnAStaticSectionOrNotPositiveIsRefusedInTheClient(t *testing.T) {
	client := connect(t, shared(t))
	_, err := client.Section(bg, "static", 1, "Static.", dsp.WithCallbackTimeout(3*time.Second))
	if failed := wantError(t, err, codes.InvalidArgument, dsp.ReasonInvalidValue); failed.Message != "WithCallbackTimeout applies to a provider (a ...Func registration), not to a static value" {
		t.Fatalf("the refusal: %s", failed.Message)
	}
	provider := func(context.Context, dsp.AssembleContext) (string, error) { return "x", nil }
	for _, d := range []time.Duration{0, -time.Second} {
		_, err = client.SectionFunc(bg, "s", 1, provider, dsp.WithCallbackTimeout(d))
		wantError(t, err, codes.InvalidArgument, dsp.ReasonInvalidValue)
		_, err = client.ContextFunc(bg, "c", 1, provider, dsp.WithCallbackTimeout(d))
		wantError(t, err, codes.InvalidArgument, dsp.ReasonInvalidValue)
		_, err = client.OnAssemble(bg, passThrough, dsp.WithCallbackTimeout(d))
		wantError(t, err, codes.InvalidArgument, dsp.ReasonInvalidValue)
	}
}
