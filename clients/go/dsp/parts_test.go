package dsp_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

func TestStaticAndDynamicPartsAssembleAndRender(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "Be precise with {{model}}."))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "who", 20, func(_ context.Context, a dsp.AssembleContext) (string, error) {
		return fmt.Sprintf("You help %v.", a.Get("who")), nil
	}))
	must[*dsp.Handle[string]](t)(client.Context(bg, "mode", 1, "Mode: {{mode}}."))
	must[*dsp.VariableHandle](t)(client.Variable(bg, "model", "deepseek-v4"))
	must[*dsp.VariableHandle](t)(client.VariableFunc(bg, "mode", func(_ context.Context, a dsp.AssembleContext) (string, bool, error) {
		mode, ok := a.Get("mode").(string)
		return mode, ok, nil
	}))
	params := `{"type":"object","properties":{"n":{"type":"integer"}}}`
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.Tools(bg, dsp.ToolProviderResult{
		Schemas: []dsp.ToolSchema{{Name: "zeta", Description: "z", ParametersJSON: params}, {Name: "alpha", Description: "a"}},
	}))

	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithFields(map[string]any{"who": "alice", "mode": "fast"})))
	equal(t, names(assembly.Sections), []string{"rules", "who"})
	equal(t, names(assembly.Contexts), []string{"mode"})
	equal(t, toolNames(assembly), []string{"alpha", "zeta"})
	if assembly.Tools[1].ParametersJSON != params {
		t.Fatalf("tool parameters changed on the way: %s", assembly.Tools[1].ParametersJSON)
	}
	if got := text(assembly, "who"); got != "You help alice." {
		t.Fatalf("dynamic section: %q", got)
	}
	if assembly.Sections[0].Text != identity {
		t.Fatalf("the identity section comes first: %+v", assembly.Sections[0])
	}

	rendered := must[*dsp.Rendered](t)(client.Render(bg, dsp.WithFields(map[string]any{"who": "bob", "mode": "slow"})))
	want := identity + "\n\nBe precise with deepseek-v4.\n\nYou help bob."
	if rendered.Prompt != want {
		t.Fatalf("prompt %q, want %q", rendered.Prompt, want)
	}
	if rendered.ContextSnapshot != "Current runtime context. This snapshot supersedes earlier runtime-context snapshots.\n\nMode: slow." {
		t.Fatalf("snapshot %q", rendered.ContextSnapshot)
	}

	// Without a mode the variable has no value, and rendering says so in the registry's words.
	_, err := client.Render(bg)
	failed := failure(t, err)
	if failed.Code != codes.FailedPrecondition || failed.Reason != dsp.ReasonRenderFailed {
		t.Fatalf("render without a value: %+v", failed)
	}
	if failed.Message != `prompt variable "{{mode}}" has no value for this assembly (context "mode")` {
		t.Fatalf("message %q", failed.Message)
	}
}

func TestHandlesUpdateInPlaceAndDisposeIdempotently(t *testing.T) {
	client := connect(t, shared(t))
	rules := must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "Old."))
	must[*dsp.Handle[string]](t)(client.Section(bg, "after", 20, "After."))
	revision := must[uint64](t)(rules.Update(bg, "New."))
	if revision == 0 {
		t.Fatal("an update answers the revision after it")
	}
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg))
	equal(t, names(assembly.Sections), []string{"rules", "after"})
	if text(assembly, "rules") != "New." {
		t.Fatalf("updated text: %q", text(assembly, "rules"))
	}
	dynamic := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 30, func(context.Context, dsp.AssembleContext) (string, error) {
		return "D.", nil
	}))
	_, err := dynamic.Update(bg, "static now?")
	if failure(t, err).Reason != dsp.ReasonNotUpdatable {
		t.Fatalf("updating a provider's registration: %v", err)
	}
	check(t, rules.Dispose(bg))
	check(t, rules.Dispose(bg))
	assembly = must[*dsp.Assembly](t)(client.Assemble(bg))
	equal(t, names(assembly.Sections), []string{"after", "dynamic"})
}

func TestScopesShadowAndAShadowedProviderIsNotAsked(t *testing.T) {
	client := connect(t, shared(t))
	asked := 0
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "greeting", 10, func(context.Context, dsp.AssembleContext) (string, error) {
		asked++
		return "Global hello.", nil
	}))
	team := must[*dsp.Scope](t)(client.Scope(bg, "go-team"))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-agent", dsp.WithParent("go-team")))
	must[*dsp.Handle[string]](t)(team.Section(bg, "greeting", 10, "Team hello."))
	must[*dsp.Handle[string]](t)(team.Section(bg, "team-only", 20, "Team rule."))
	must[*dsp.VariableHandle](t)(agent.Variable(bg, "who", "agent"))
	must[*dsp.Handle[string]](t)(agent.Context(bg, "agent-context", 1, "Agent {{who}}."))

	assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-agent")))
	equal(t, names(assembly.Sections), []string{"greeting", "team-only"})
	if text(assembly, "greeting") != "Team hello." || asked != 0 {
		t.Fatalf("the team's greeting shadows the global one, unasked: %q, asked %d", text(assembly, "greeting"), asked)
	}
	equal(t, names(assembly.Contexts), []string{"agent-context"})

	global := must[*dsp.Assembly](t)(client.Assemble(bg))
	if text(global, "greeting") != "Global hello." || asked != 1 {
		t.Fatalf("without a scope: %q, asked %d", text(global, "greeting"), asked)
	}

	_, err := client.Scope(bg, "go-agent", dsp.WithParent("elsewhere"))
	if failed := failure(t, err); failed.Code != codes.AlreadyExists || failed.Reason != dsp.ReasonScopeParentConflict {
		t.Fatalf("a conflicting parent: %+v", failed)
	}

	check(t, team.Dispose(bg))
	check(t, team.Dispose(bg))
	assembly = must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-agent")))
	equal(t, names(assembly.Sections), []string{"greeting"})
	if text(assembly, "greeting") != "Global hello." {
		t.Fatalf("with the team's handle disposed: %q", text(assembly, "greeting"))
	}
}

func TestSuppressingRuntimeContext(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Context(bg, "clock", 1, "Now."))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-quiet"))
	off := must[*dsp.Registration](t)(scope.SuppressRuntimeContext(bg))
	if got := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-quiet"))); len(got.Contexts) != 0 {
		t.Fatalf("suppressed: %v", got.Contexts)
	}
	if got := must[*dsp.Assembly](t)(client.Assemble(bg)); len(got.Contexts) != 1 {
		t.Fatalf("elsewhere: %v", got.Contexts)
	}
	check(t, off.Dispose(bg))
	if got := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-quiet"))); len(got.Contexts) != 1 {
		t.Fatalf("after the suppressor: %v", got.Contexts)
	}
}

func TestErrorsCarryCodeReasonAndTheRegistrysWords(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Section(bg, "dup", 1, "One."))
	cases := []struct {
		name    string
		call    func() error
		code    codes.Code
		reason  dsp.Reason
		message string
	}{
		{"duplicate", func() error { _, err := client.Section(bg, "dup", 2, "Two."); return err },
			codes.AlreadyExists, dsp.ReasonDuplicateName,
			`prompt section "dup" is already registered (for a per-agent override, register through that agent's scope instead)`},
		{"variable name", func() error { _, err := client.Variable(bg, "Not Valid", "x"); return err },
			codes.InvalidArgument, dsp.ReasonInvalidVariableName,
			`invalid prompt variable name "Not Valid" (must match /^[a-z][a-z0-9_]*$/)`},
		{"order", func() error { _, err := client.Context(bg, "bad-order", nanOrder(), "x"); return err },
			codes.InvalidArgument, dsp.ReasonInvalidOrder, `prompt context "bad-order" order must be a finite number`},
		{"reserved tool", func() error {
			_, err := client.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: dsp.ToolOrderRest}}})
			return err
		}, codes.FailedPrecondition, dsp.ReasonReservedToolName, ""},
		{"tool JSON", func() error {
			_, err := client.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "t", ParametersJSON: "{"}}})
			return err
		}, codes.InvalidArgument, dsp.ReasonInvalidValue, ""},
	}
	for _, c := range cases {
		failed := failure(t, c.call())
		if failed.Code != c.code || failed.Reason != c.reason || (c.message != "" && failed.Message != c.message) {
			t.Errorf("%s: got %v %s %q", c.name, failed.Code, failed.Reason, failed.Message)
		}
	}

	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-complete"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "first", 1, "A.", dsp.Complete()))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "second", 2, "B.", dsp.Complete()))
	_, err := client.Assemble(bg, dsp.ForScope("go-complete"))
	failed := failure(t, err)
	if failed.Reason != dsp.ReasonMultipleCompleteSections ||
		failed.Message != `multiple complete prompt sections are active: "first", "second"` {
		t.Fatalf("two complete sections: %+v", failed)
	}
	if dsp.ReasonOf(fmt.Errorf("wrapped: %w", err)) != dsp.ReasonMultipleCompleteSections {
		t.Fatal("ReasonOf sees through wrapping")
	}
}

func nanOrder() float64 {
	zero := 0.0
	return zero / zero
}

func TestAProvidersFailureFailsTheAssemblyWithItsMessage(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-failing"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "broken", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		return "", errors.New("the disk is gone")
	}))
	_, err := client.Assemble(bg, dsp.ForScope("go-failing"))
	failed := failure(t, err)
	if failed.Code != codes.Aborted || failed.Reason != dsp.ReasonProviderFailed {
		t.Fatalf("a failing provider: %+v", failed)
	}
	if !contains(failed.Message, "the disk is gone") {
		t.Fatalf("the provider's message is quoted: %q", failed.Message)
	}
	panicking := must[*dsp.Scope](t)(client.Scope(bg, "go-panicking"))
	must[*dsp.Handle[string]](t)(panicking.SectionFunc(bg, "panics", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		panic("boom")
	}))
	_, err = client.Assemble(bg, dsp.ForScope("go-panicking"))
	if failed := failure(t, err); failed.Reason != dsp.ReasonProviderFailed || !contains(failed.Message, "boom") {
		t.Fatalf("a panicking provider: %+v", failed)
	}
}

func TestCancellingAnAssemblyCancelsTheProvidersContext(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-slow"))
	started, cancelled := make(chan struct{}), make(chan error, 1)
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "slow", 1, func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		close(started)
		<-ctx.Done()
		cancelled <- ctx.Err()
		return "", ctx.Err()
	}))
	ctx, cancel := context.WithCancel(bg)
	go func() {
		<-started
		cancel()
	}()
	_, err := client.Assemble(ctx, dsp.ForScope("go-slow"))
	if failure(t, err).Code != codes.Canceled {
		t.Fatalf("a cancelled assembly: %v", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the provider's context was never cancelled")
	}
}

func TestADeadlineReachesTheProviderAndFailsTheAssemblyInTime(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-late"))
	deadlines := make(chan time.Duration, 1)
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "late", 1, func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		deadline, _ := ctx.Deadline()
		deadlines <- time.Until(deadline)
		<-ctx.Done()
		return "", ctx.Err()
	}))
	started := time.Now()
	_, err := client.Assemble(within(t, time.Second), dsp.ForScope("go-late"))
	failed := failure(t, err)
	if failed.Code != codes.DeadlineExceeded {
		t.Fatalf("a late provider: %+v", failed)
	}
	if elapsed := time.Since(started); elapsed > 3*time.Second {
		t.Fatalf("the assembly took %s", elapsed)
	}
	if left := <-deadlines; left <= 0 || left > time.Second {
		t.Fatalf("the provider's context has the caller's deadline: %s left", left)
	}
}

func TestAssemblyEqualsByValue(t *testing.T) {
	client := connect(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Section(bg, "same", 1, "Same."))
	first := must[*dsp.Assembly](t)(client.Assemble(bg))
	second := must[*dsp.Assembly](t)(client.Assemble(bg))
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("two assemblies of one state differ: %+v %+v", first, second)
	}
}

func contains(text, part string) bool {
	return len(part) == 0 || (len(text) >= len(part) && (text[:len(part)] == part || contains(text[1:], part)))
}

func TestAUnixSocketAddressAndAStaticToolUpdate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sidecar.sock")
	startSidecar(t, nil, "--listen", "unix:"+path)
	client := connect(t, &sidecar{address: "unix:" + path})
	tools := must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.Tools(bg, dsp.ToolProviderResult{
		Schemas: []dsp.ToolSchema{{Name: "old", ParametersJSON: `{}`}},
	}))
	must[uint64](t)(tools.Update(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "new", ParametersJSON: `{"a":1}`}}}))
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg))
	equal(t, toolNames(assembly), []string{"new"})
	if assembly.Tools[0].ParametersJSON != `{"a":1}` {
		t.Fatalf("the updated schema: %s", assembly.Tools[0].ParametersJSON)
	}
	_, err := tools.Update(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "bad", ParametersJSON: `{`}}})
	if failure(t, err).Reason != dsp.ReasonInvalidValue {
		t.Fatalf("parameters that are not JSON are refused before sending: %v", err)
	}
}

func TestConcurrentRegistrationsAndAssembliesFromManyGoroutines(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-concurrent"))
	must[*dsp.Handle[string]](t)(scope.SectionFunc(bg, "who", 1, func(_ context.Context, a dsp.AssembleContext) (string, error) {
		time.Sleep(5 * time.Millisecond) // several ProvideRequests are outstanding at once
		return fmt.Sprint(a.Get("n")), nil
	}))
	errs := make(chan error, 16)
	for g := 0; g < 8; g++ {
		go func(g int) {
			errs <- func() error {
				handle, err := scope.Section(bg, fmt.Sprintf("own-%d", g), float64(10+g), "Own.")
				if err != nil {
					return err
				}
				for i := 0; i < 10; i++ {
					assembly, err := client.Assemble(bg, dsp.ForScope("go-concurrent"), dsp.WithFields(map[string]any{"n": g*100 + i}))
					if err != nil {
						return err
					}
					if got, want := text(assembly, "who"), fmt.Sprint(g*100+i); got != want {
						return fmt.Errorf("assembly for %s got %s", want, got)
					}
				}
				return handle.Dispose(bg)
			}()
		}(g)
	}
	for g := 0; g < 8; g++ {
		check(t, <-errs)
	}
	equal(t, names(must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-concurrent"), dsp.WithFields(map[string]any{"n": 1}))).Sections), []string{"who"})
}

func TestAVariableWithNoValueGetsOneAndLosesItInPlace(t *testing.T) {
	client := connect(t, shared(t))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-unset"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "uses", 1, "In {{cwd}}."))
	cwd := must[*dsp.VariableHandle](t)(scope.VariableUnset(bg, "cwd"))
	value := func() *string {
		assembly := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-unset")))
		for _, v := range assembly.Variables {
			if v.Name == "cwd" {
				return v.Value
			}
		}
		t.Fatal("no variable cwd")
		return nil
	}
	if value() != nil {
		t.Fatal("a variable registered unset has no value")
	}
	_, err := client.Render(bg, dsp.ForScope("go-unset"))
	wantRender := `prompt variable "{{cwd}}" has no value for this assembly (section "uses")`
	if failed := failure(t, err); failed.Reason != dsp.ReasonRenderFailed || failed.Message != wantRender {
		t.Fatalf("rendering it: %+v", failed)
	}
	must[uint64](t)(cwd.Update(bg, "/tmp"))
	if got := value(); got == nil || *got != "/tmp" {
		t.Fatalf("after Update: %v", got)
	}
	must[uint64](t)(cwd.Unset(bg))
	if value() != nil {
		t.Fatal("after Unset the variable has no value again")
	}
	dynamic := must[*dsp.VariableHandle](t)(scope.VariableFunc(bg, "dyn", func(context.Context, dsp.AssembleContext) (string, bool, error) {
		return "", false, nil
	}))
	_, err = dynamic.Unset(bg)
	if failure(t, err).Reason != dsp.ReasonNotUpdatable {
		t.Fatalf("unsetting a provider's variable: %v", err)
	}
}
