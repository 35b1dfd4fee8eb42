package dsp_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// Blame only who was late (issue 34, item 4): with "each-answer" (docs/protocol.md,
// "Versions and features") this client answers a ProvideRequest provider by
// provider, so the sidecar takes the answers that came and judges each provider
// against its own time, on a real sidecar (provider_timeout_s 0.5, ejected after
// one timeout).

// ejectedBefore names the providers of changes ejected before marker registered:
// the sidecar ejects while it judges an exchange, before the assembly answers, so
// a marker registered after the assembly closes the count.
func ejectedBefore(t *testing.T, changes *dsp.ChangeStream, marker string) []string {
	t.Helper()
	ejected := []string{}
	for {
		event := nextEvent(t, changes)
		if event.Action == "registered" && event.Name == marker {
			return ejected
		}
		if event.Action == "unregistered" && strings.HasPrefix(event.Reason, "ejected: ") {
			ejected = append(ejected, event.Name)
		}
	}
}

func TestASlowProviderIsEjectedAloneAndItsInstantNeighboursAreTaken(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-blame"))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-blame", false)))
	defer changes.Close()
	// All three under IGNORE, so one ProvideRequest asks for them all. The instant two
	// may take 5 s each (a loaded machine never makes them late); the slow one has the
	// sidecar's 0.5 s and answers only once the sidecar gives up on it.
	roomy := dsp.WithCallbackTimeout(5 * time.Second)
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "slow", 10, func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		<-ctx.Done()
		return "too late", nil
	}, ignore))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "instant", 20, func(context.Context, dsp.AssembleContext) (string, error) {
		return "Here at once.", nil
	}, ignore, roomy))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.ToolsFunc(bg, func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "search", Description: "Search."}}}, nil
	}, ignore, roomy, dsp.ToolsName("instant-tools")))

	var skipped []dsp.SkippedStep
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-blame"), dsp.WithSkipped(&skipped)))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "marker", 1, "After the assembly."))

	// Without the feature the exchange timed out as a whole: all three were ejected
	// and skipped, and the instant ones' parts were missing.
	equal(t, ejectedBefore(t, changes, "marker"), []string{"slow"})
	if len(skipped) != 1 || skipped[0].Name != "slow" || skipped[0].Reason != dsp.ReasonProviderTimeout {
		t.Fatalf("skipped: %+v", skipped)
	}
	if text(assembly, "instant") != "Here at once." || len(assembly.Tools) != 1 || assembly.Tools[0].Name != "search" {
		t.Fatalf("the instant providers' parts: sections %v, tools %+v", names(assembly.Sections), assembly.Tools)
	}
}
