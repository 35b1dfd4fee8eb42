package dsp_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

func TestListenersRunBeforeAndAfterNextAndByTailCall(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-listened"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "base", 10, "Base."))
	var order []string
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, c dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		order = append(order, "outer before")
		a.Sections = append(a.Sections, dsp.Part{Name: "outer", Text: "Outer for " + c.Scope + "."})
		returned, err := next.Call(a)
		if err != nil {
			return nil, err
		}
		order = append(order, "outer after")
		returned.Sections = append(returned.Sections, dsp.Part{Name: "post", Text: "After the rest."})
		return returned, nil
	}))
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		order = append(order, "tail")
		a.Sections = append(a.Sections, dsp.Part{Name: "inner", Text: "Inner."})
		return next.Tail(a)
	}))
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-listened")))
	equal(t, names(assembly.Sections), []string{"base", "outer", "inner", "post"})
	equal(t, order, []string{"outer before", "tail", "outer after"})
	if text(assembly, "outer") != "Outer for go-listened." {
		t.Fatalf("the listener got the assemble context: %q", text(assembly, "outer"))
	}

	// A scoped listener sees nothing of other assemblies; Prepend runs first.
	order = nil
	global := must[*dsp.Assembly](t)(client.Assemble(bg))
	if len(order) != 0 || len(names(global.Sections)) != 0 {
		t.Fatalf("a scoped listener ran for an unscoped assembly: %v", order)
	}
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		order = append(order, "first")
		return next.Tail(a)
	}, dsp.Prepend()))
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-listened")))
	equal(t, order, []string{"first", "outer before", "tail", "outer after"})
}

func TestAListenerShortCircuitsFailsOrIsDisposed(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-short"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "base", 10, "Base."))
	var later atomic.Int32
	short := must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, _ *dsp.Assembly, _ dsp.AssembleContext, _ *dsp.Next) (*dsp.Assembly, error) {
		return &dsp.Assembly{Sections: []dsp.Part{{Name: "only", Text: "Only this."}}}, nil
	}))
	failing := must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		later.Add(1)
		return nil, errors.New("listener says no")
	}))
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-short")))
	equal(t, names(assembly.Sections), []string{"only"})
	if later.Load() != 0 {
		t.Fatal("the rest of the chain ran after a short circuit")
	}
	check(t, short.Dispose(bg))
	check(t, short.Dispose(bg))
	_, err := client.Assemble(bg, dsp.ForScope("go-short"))
	failed := failure(t, err)
	if failed.Code != codes.Aborted || failed.Reason != dsp.ReasonListenerFailed || !strings.Contains(failed.Message, "listener says no") {
		t.Fatalf("a failing listener: %+v", failed)
	}
	check(t, failing.Dispose(bg))
	assembly = must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-short")))
	equal(t, names(assembly.Sections), []string{"base"})
}

func TestNextTwiceIsRefusedAndAnInvalidResultIsRejected(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-twice"))
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		if _, err := next.Call(a); err != nil {
			return nil, err
		}
		return next.Call(a)
	}))
	_, err := client.Assemble(bg, dsp.ForScope("go-twice"))
	if failed := failure(t, err); failed.Reason != dsp.ReasonListenerFailed || !strings.Contains(failed.Message, "once per invocation") {
		t.Fatalf("next twice: %+v", failed)
	}
	other := must[*dsp.Scope](t)(client.Scope(bg, "go-invalid"))
	must[*dsp.Registration](t)(other.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "", Text: "Nameless."})
		return next.Tail(a)
	}))
	_, err = client.Assemble(bg, dsp.ForScope("go-invalid"))
	if failed := failure(t, err); failed.Reason != dsp.ReasonInvariantViolation ||
		failed.Message != "assembled section names must be non-empty" {
		t.Fatalf("an invalid result: %+v", failed)
	}
}

func TestToolsPassThroughListenersAsSlotsAndStayByteIdentical(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-tools"))
	schema := `{"type": "object",  "properties": {"b": {}, "a": {}}}`
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{
		{Name: "bash", Description: "Run a command.", ParametersJSON: schema},
		{Name: "todo", Description: "Keep a list.", ParametersJSON: `{}`},
	}}))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.ToolsFunc(bg, func(_ context.Context, a dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "dynamic", ParametersJSON: `{"x":1}`}}}, nil
	}))
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Tools = append(a.Tools, dsp.ToolSchema{Name: "added", Description: "By a listener."})
		returned, err := next.Call(a)
		if err != nil {
			return nil, err
		}
		returned.Tools = append([]dsp.ToolSchema{returned.Tools[len(returned.Tools)-1]}, returned.Tools[:len(returned.Tools)-1]...)
		return returned, nil
	}))
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		returned, err := next.Call(a) // unchanged tools come back as slots, and go on as slots
		if err != nil {
			return nil, err
		}
		return returned, nil
	}))
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-tools")))
	equal(t, toolNames(assembly), []string{"added", "bash", "dynamic", "todo"})
	if assembly.Tools[1].ParametersJSON != schema || assembly.Tools[2].ParametersJSON != `{"x":1}` {
		t.Fatalf("tool schemas are byte-identical through the listeners: %s", assembly.Tools[1].ParametersJSON)
	}
}

func TestAListenersContextIsCancelledWhenTheAssemblyIs(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-abandoned"))
	started, cancelled := make(chan struct{}), make(chan struct{})
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		close(started)
		<-ctx.Done()
		close(cancelled)
		return nil, ctx.Err()
	}))
	ctx, cancel := context.WithCancel(bg)
	go func() {
		<-started
		cancel()
	}()
	_, err := client.Assemble(ctx, dsp.ForScope("go-abandoned"))
	if failure(t, err).Code != codes.Canceled {
		t.Fatalf("a cancelled assembly: %v", err)
	}
	<-cancelled
}

func TestAListenerIsInstalledWithinItsCallersCtxAndOutlivesIt(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-outlived"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "base", 10, "Base."))
	signing := func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "signed", Text: "Signed."})
		return next.Tail(a)
	}
	gone, cancel := context.WithCancel(bg)
	cancel()
	_, err := scope.OnAssemble(gone, signing)
	wantError(t, err, codes.Canceled, dsp.ReasonUnknown)
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-outlived")))
	equal(t, names(assembly.Sections), []string{"base"})

	session := client.SessionID()
	ctx, cancel := context.WithCancel(bg)
	must[*dsp.Registration](t)(scope.OnAssemble(ctx, signing))
	cancel()
	time.Sleep(200 * time.Millisecond) // time for a stream tied to ctx to end
	assembly = must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-outlived")))
	equal(t, names(assembly.Sections), []string{"base", "signed"})
	if client.SessionID() != session {
		t.Fatal("the listener's stream ended with its install's ctx: the session was made again")
	}
}
