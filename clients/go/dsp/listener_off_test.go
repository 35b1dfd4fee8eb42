package dsp_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// A listener's Dispose disposes it through its own stream: half-closed, the
// sidecar disposes it and ends the stream with OK, so no Dispose follows (it was
// refused NOT_FOUND when the stream's cancel had disposed it first), and once
// Dispose returns no assembly sees the listener.

const offRounds = 20

// disposeCalls counts the Dispose calls a client makes, and the status of each the sidecar refused.
type disposeCalls struct {
	calls   atomic.Int32
	mu      sync.Mutex
	refused []string
	traces  []any // what each call's ctx carried under traceKey
}

// traceKey keys a value (tracing metadata, say) that a disposal's calls carry from the caller's ctx.
type traceKey struct{}

func (d *disposeCalls) option() dsp.Option {
	return dsp.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/dsh.systemprompt.v1.SystemPromptService/Dispose" {
			d.calls.Add(1)
			d.mu.Lock()
			d.traces = append(d.traces, ctx.Value(traceKey{}))
			if err != nil {
				d.refused = append(d.refused, status.Code(err).String())
			}
			d.mu.Unlock()
		}
		return err
	}))
}

// seen is how many Dispose calls were made and the codes of those refused.
func (d *disposeCalls) seen() (int32, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls.Load(), append([]string{}, d.refused...)
}

func (d *disposeCalls) want(t *testing.T, calls int32) {
	t.Helper()
	made, refused := d.seen()
	if made != calls || len(refused) != 0 {
		t.Fatalf("Dispose calls: %d made (want %d), refused %v", made, calls, refused)
	}
}

func marking(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
	a.Sections = append(a.Sections, dsp.Part{Name: "go-off-mark", Text: "Seen."})
	return next.Tail(a)
}

func marked(t *testing.T, client *dsp.Client, opts ...dsp.AssembleOption) bool {
	t.Helper()
	return text(must[*dsp.Assembly](t)(client.Assemble(bg, opts...)), "go-off-mark") != "<absent>"
}

func TestDisposingAListenerSendsNoDisposeAfterItsStreamsEndDisposedIt(t *testing.T) {
	disposes := &disposeCalls{}
	client := connect(t, shared(t), disposes.option())
	session := client.SessionID()
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-off"))
	for _, on := range []func(context.Context, dsp.Listener, ...dsp.ListenerOption) (*dsp.Registration, error){client.OnAssemble, scope.OnAssemble} {
		off := must[*dsp.Registration](t)(on(bg, marking))
		if !marked(t, client, dsp.ForScope("go-off")) {
			t.Fatal("the listener did not run")
		}
		check(t, off.Dispose(bg)) // half-closed: the sidecar disposed it, then ended the stream with OK
		if marked(t, client, dsp.ForScope("go-off")) {
			t.Fatal("a disposed listener ran")
		}
	}
	disposes.want(t, 0) // was: one for each, after the stream's cancel, refused NOT_FOUND
	section := must[*dsp.Handle[string]](t)(client.Section(bg, "plain", 1, "Plain."))
	check(t, section.Dispose(bg)) // a registration without a stream of its own: one Dispose
	disposes.want(t, 1)
	if client.SessionID() != session {
		t.Fatal("disposing a listener made the session again")
	}
}

func TestOnceAListenersDisposeReturnsNoAssemblySeesIt(t *testing.T) {
	owner, assembler := connect(t, shared(t)), connect(t, shared(t))
	for round := 0; round < offRounds; round++ {
		off := must[*dsp.Registration](t)(owner.OnAssemble(bg, marking))
		if !marked(t, assembler) {
			t.Fatalf("round %d: the listener did not run", round)
		}
		check(t, off.Dispose(bg))
		if marked(t, assembler) || marked(t, owner) { // from another connection, or its own
			t.Fatalf("round %d: an assembly saw the listener after its Dispose returned", round)
		}
	}
}

func TestAListenerMayDisposeItselfFromItsInvocation(t *testing.T) {
	disposes := &disposeCalls{}
	owner := connect(t, shared(t), disposes.option())
	assembler := connect(t, shared(t))
	session := owner.SessionID()
	var off atomic.Pointer[dsp.Registration]
	returned := make(chan error, 1)
	off.Store(must[*dsp.Registration](t)(owner.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		select {
		case returned <- off.Load().Dispose(ctx): // the stream's end cancels ctx: Dispose still returns
		default: // invoked again: the test fails on its first
		}
		return marking(ctx, a, dsp.AssembleContext{}, next)
	})))
	_, _ = assembler.Assemble(bg) // the listener's stream ended under it
	if err := <-returned; err != nil {
		t.Fatalf("a listener's own Dispose: %v", err)
	}
	disposes.want(t, 0)
	if marked(t, assembler) || marked(t, owner) {
		t.Fatal("an assembly saw the listener after its Dispose returned")
	}
	if owner.SessionID() != session {
		t.Fatal("a listener disposing itself made the session again")
	}
}

// cancelled is a ctx already cancelled, carrying "trace-7" under traceKey.
func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.WithValue(bg, traceKey{}, "trace-7"))
	cancel()
	return ctx
}

func TestADisposeWhoseCtxIsCancelledStillDisposes(t *testing.T) {
	disposes := &disposeCalls{}
	client := connect(t, shared(t), disposes.option())
	off := must[*dsp.Registration](t)(client.OnAssemble(bg, marking))
	if !marked(t, client) {
		t.Fatal("the listener did not run")
	}
	check(t, off.Dispose(cancelled())) // was: context canceled, its Dispose refused Canceled
	disposes.want(t, 0)                // its stream's end disposed it
	if marked(t, client) {
		t.Fatal("an assembly saw the listener after its Dispose returned")
	}
	section := must[*dsp.Handle[string]](t)(client.Section(bg, "go-off-mark", 1, "Seen."))
	check(t, section.Dispose(cancelled())) // a Dispose, made whatever the ctx
	disposes.want(t, 1)
	if marked(t, client) {
		t.Fatal("an assembly saw the section after its Dispose returned")
	}
	if disposes.traces[0] != "trace-7" {
		t.Fatalf("the Dispose carried %v, not the caller's ctx's value", disposes.traces[0])
	}
}

func TestAListenerMayDisposeItselfWithItsInvocationsCtxOnceCancelled(t *testing.T) {
	disposes := &disposeCalls{}
	owner := connect(t, shared(t), disposes.option())
	assembler := connect(t, shared(t))
	var off atomic.Pointer[dsp.Registration]
	var invoked atomic.Int32
	running, returned := make(chan struct{}), make(chan error, 1)
	off.Store(must[*dsp.Registration](t)(owner.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		if invoked.Add(1) > 1 { // invoked again: it was not disposed
			return marking(ctx, a, dsp.AssembleContext{}, next)
		}
		close(running)
		<-ctx.Done() // the assembly was cancelled: the sidecar cancels this invocation
		returned <- off.Load().Dispose(ctx)
		return nil, ctx.Err()
	})))
	ctx, cancel := context.WithCancel(bg)
	assembled := make(chan struct{})
	go func() {
		defer close(assembled)
		_, _ = assembler.Assemble(ctx)
	}()
	<-running
	cancel()
	<-assembled
	if err := <-returned; err != nil { // was: context canceled, and a Dispose refused Canceled
		t.Fatalf("a listener's own Dispose with its cancelled ctx: %v", err)
	}
	disposes.want(t, 0)
	if marked(t, assembler) || marked(t, owner) {
		t.Fatal("an assembly saw the listener after its Dispose returned")
	}
}
