package dsp_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// An answer over the sidecar's max_message_bytes (SessionOpened says the bound) is
// sent as its provider's error: that assembly fails naming the provider, and the
// session lives on (issue 34, item 4), on a real sidecar.

func TestAnAnswerOverTheMessageBoundFailsOnlyItsAssembly(t *testing.T) {
	client := connect(t, shared(t))
	huge := strings.Repeat("d", 5<<20) // over the default 4 MiB
	tools := func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "big", Description: huge}}}, nil
	}
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.ToolsFunc(bg, tools, dsp.ToolsName("huge")))
	session := client.SessionID()
	_, err := client.Assemble(bg)
	var failure *dsp.Error
	if !errors.As(err, &failure) || failure.Code != codes.Aborted || failure.Reason != dsp.ReasonProviderFailed ||
		!strings.Contains(failure.Message, `tools provider "huge"`) || !strings.Contains(failure.Message, "over the largest message") {
		t.Fatalf("the assembly's error: %v", err)
	}
	must[*dsp.Handle[string]](t)(client.Section(bg, "after", 10, "still here"))
	if client.SessionID() != session {
		t.Fatalf("the session was replaced: %s, then %s", session, client.SessionID())
	}
}

// Per provider: of two providers asked in one ProvideRequest (both under IGNORE), only
// the one whose answer is over the bound fails; its neighbour's answer is taken, and
// the sidecar logs the one it refused.
func TestAnAnswerOverTheMessageBoundFailsOnlyItsOwnProvider(t *testing.T) {
	sidecar := shared(t)
	client := connect(t, sidecar)
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-blame-oversize"))
	// The 5 MB answer (over the default 4 MiB) is sent as its provider's error.
	huge := strings.Repeat("d", 5<<20)
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "dump", 10, func(context.Context, dsp.AssembleContext) (string, error) {
		return huge, nil
	}, ignore))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "small", 20, func(context.Context, dsp.AssembleContext) (string, error) {
		return "Small.", nil
	}, ignore))
	const logged = "over the largest message read"
	before := strings.Count(sidecar.log(), logged)
	var skipped []dsp.SkippedStep
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-blame-oversize"), dsp.WithSkipped(&skipped)))
	if len(skipped) != 1 || skipped[0].Name != "dump" || skipped[0].Reason != dsp.ReasonProviderFailed ||
		!strings.Contains(skipped[0].Message, "over the largest message") {
		t.Fatalf("skipped: %+v", skipped)
	}
	equal(t, names(assembly.Sections), []string{"small"})
	if strings.Count(sidecar.log(), logged) != before+1 {
		t.Fatalf("the sidecar did not log the answer once: %s", sidecar.log())
	}
}
