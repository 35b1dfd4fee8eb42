package dsp_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// Ejected callbacks (docs/protocol.md, "Ejected callbacks") on a real sidecar
// whose callbacks have half a second (slowCallbacks): this client makes them again.

// assembleUntil assembles until done holds of the result (the re-install waits
// out its backoff), failing after 15 s.
func assembleUntil(t *testing.T, client *dsp.Client, what string, done func(*dsp.Assembly) bool) *dsp.Assembly {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		assembly := must[*dsp.Assembly](t)(client.Assemble(bg))
		if done(assembly) {
			return assembly
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, names(assembly.Sections))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestAnEjectedListenerIsInstalledAgainOnItsSessionAndItsHandleStillDisposesIt(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	session := client.SessionID()
	var calls atomic.Int32
	handle := must[*dsp.Registration](t)(client.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // stuck, the first time, until the sidecar gives up on it
		}
		a.Sections = append(a.Sections, dsp.Part{Name: "signed", Text: "Signed."})
		return next.Tail(a)
	}))
	_, err := client.Assemble(bg)
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonListenerTimeout)

	signed := func(a *dsp.Assembly) bool { return text(a, "signed") == "Signed." }
	assembleUntil(t, client, "the listener installed again", signed)
	if client.SessionID() != session {
		t.Fatalf("the session was made again (%s, was %s): only the listener should be", client.SessionID(), session)
	}
	check(t, handle.Dispose(bg))
	if assembly := must[*dsp.Assembly](t)(client.Assemble(bg)); signed(assembly) {
		t.Fatal("the disposed listener still ran")
	}
}

func TestAnEjectedProviderIsRegisteredAgainOnItsSession(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	session := client.SessionID()
	var calls atomic.Int32
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 1, "Be precise."))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "clock", 10, func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // stuck, the first time
		}
		return "It is noon.", nil
	}))
	_, err := client.Assemble(bg)
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonProviderTimeout)

	assembly := assembleUntil(t, client, "the provider registered again", func(a *dsp.Assembly) bool {
		return text(a, "clock") == "It is noon."
	})
	equal(t, names(assembly.Sections), []string{"rules", "clock"})
	if client.SessionID() != session {
		t.Fatalf("the session was made again (%s, was %s): only the provider should be", client.SessionID(), session)
	}
}

// disposal is the next unregistration of name on changes; the events between are skipped.
func disposal(t *testing.T, changes *dsp.ChangeStream, name string) dsp.ChangeEvent {
	t.Helper()
	for {
		if event := nextEvent(t, changes); event.Action == "unregistered" && event.Name == name {
			return event
		}
	}
}

func TestTheDisposalOfAnEjectedListenerCarriesTheReason(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-ejected-listener"))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-ejected-listener", false)))
	defer changes.Close()
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		<-ctx.Done() // stuck until the sidecar gives up on it
		return next.Tail(a)
	}, dsp.ListenerName("stuck")))
	_, err := client.Assemble(bg, dsp.ForScope("go-ejected-listener"))
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonListenerTimeout)

	event := disposal(t, changes, "stuck")
	if event.Kind != "listener" || event.Reason != `ejected: listener "stuck" did not answer within 0.5s` {
		t.Fatalf("the ejected listener's disposal: %+v", event)
	}
}

func TestTheDisposalOfAnEjectedProviderCarriesTheReasonAndAPlainOneNone(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-ejected-provider"))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-ejected-provider", false)))
	defer changes.Close()
	plain := must[*dsp.Handle[string]](t)(scope.Section(bg, "plain", 1, "Disposed by its owner."))
	check(t, plain.Dispose(bg))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "stuck", 10, func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	}))
	_, err := client.Assemble(bg, dsp.ForScope("go-ejected-provider"))
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonProviderTimeout)

	if event := disposal(t, changes, "plain"); event.Reason != "" {
		t.Fatalf("a disposal by its owner carries no reason: %+v", event)
	}
	event := disposal(t, changes, "stuck")
	want := `ejected: section provider "stuck" in scope "go-ejected-provider" did not answer within 0.5s`
	if event.Kind != "section" || event.Reason != want {
		t.Fatalf("the ejected provider's disposal: %+v", event)
	}
}
