package dsp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// A call its ctx ended wraps ctx's error, on a real sidecar; the sidecar's own
// failures, its timeouts included, wrap nothing.

// hanging is a provider that answers only when its ctx ends; started closes when it is asked.
func hanging(started chan struct{}) dsp.TextFunc {
	return func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		close(started)
		<-ctx.Done()
		return "", ctx.Err()
	}
}

func TestACallItsCtxCancelledIsContextCanceled(t *testing.T) {
	client := connect(t, shared(t))
	started := make(chan struct{})
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-cancelled-call"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "hangs", 1, hanging(started)))
	ctx, cancel := context.WithCancel(bg)
	go func() {
		<-started
		cancel()
	}()
	_, err := client.Assemble(ctx, dsp.ForScope("go-cancelled-call"))
	wantError(t, err, codes.Canceled, dsp.ReasonUnknown)
	if !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a cancelled assembly is not context.Canceled alone: %v (unwrapped %v)", err, errors.Unwrap(err))
	}
	calls := map[string]func(context.Context) error{
		"a registration": func(ctx context.Context) error { _, err := client.Section(ctx, "late", 1, "Late."); return err },
		"a snapshot":     func(ctx context.Context) error { _, err := client.Snapshot(ctx); return err },
		"an assembly":    func(ctx context.Context) error { _, err := client.Assemble(ctx); return err },
	}
	for what, call := range calls {
		if err := call(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s with a cancelled ctx is not context.Canceled: %v", what, err)
		}
	}
}

func TestACallPastItsCtxDeadlineIsContextDeadlineExceeded(t *testing.T) {
	client := connect(t, shared(t))
	started := make(chan struct{})
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-expired-call"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "hangs", 1, hanging(started)))
	_, err := client.Assemble(within(t, 300*time.Millisecond), dsp.ForScope("go-expired-call"))
	if failure(t, err).Code != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("an assembly past its deadline is not context.DeadlineExceeded: %v (unwrapped %v)", err, errors.Unwrap(err))
	}
	<-started
}

func TestTheSidecarsOwnFailuresWrapNoContextError(t *testing.T) {
	client := connect(t, sharedWith(t, slowCallbacks))
	must[*dsp.Handle[string]](t)(client.Section(bg, "taken", 1, "Taken."))
	_, err := client.Section(bg, "taken", 2, "Again.")
	wantError(t, err, codes.AlreadyExists, dsp.ReasonDuplicateName)
	if errors.Unwrap(err) != nil {
		t.Fatalf("a refused registration wraps %v", errors.Unwrap(err))
	}
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-provider-timeout"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "hangs", 1, hanging(make(chan struct{}))))
	_, err = client.Assemble(within(t, 10*time.Second), dsp.ForScope("go-provider-timeout"))
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonProviderTimeout)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the sidecar's provider timeout, within the caller's deadline, is context.DeadlineExceeded: %v", err)
	}
}
