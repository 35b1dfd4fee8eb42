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
