package dsp_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc"
)

// The local cache (WithLocalCache) on a real sidecar, the Go twin of
// tests/client/test_local_cache.py: a cacheable assembly is answered without a
// call, and no change, whoever makes it, leaves a stale answer behind. A client
// interceptor counts the Assemble calls that leave the client.

// assembleCalls counts the Assemble calls a client makes.
type assembleCalls struct{ n atomic.Int32 }

func (a *assembleCalls) option() dsp.Option {
	return dsp.WithDialOptions(grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any,
		cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/dsh.systemprompt.v1.SystemPromptService/Assemble" {
			a.n.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}))
}

// caching is a client of s with its local cache on, and the count of its Assemble calls.
func caching(t *testing.T, s *sidecar, opts ...dsp.Option) (*dsp.Client, *assembleCalls) {
	t.Helper()
	calls := &assembleCalls{}
	return connect(t, s, append([]dsp.Option{dsp.WithLocalCache(), calls.option()}, opts...)...), calls
}

// assembledTwice assembles twice with opts and says how many calls the second made.
func assembledTwice(t *testing.T, client *dsp.Client, calls *assembleCalls, opts ...dsp.AssembleOption) (*dsp.Assembly, int32) {
	t.Helper()
	must[*dsp.Assembly](t)(client.Assemble(bg, opts...))
	before := calls.n.Load()
	second := must[*dsp.Assembly](t)(client.Assemble(bg, opts...))
	return second, calls.n.Load() - before
}

func TestARepeatedAssembleOfAStaticScopeMakesNoCall(t *testing.T) {
	client, calls := caching(t, shared(t))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "be brief"))
	first := must[*dsp.Assembly](t)(client.Assemble(bg))
	before := calls.n.Load()
	second := must[*dsp.Assembly](t)(client.Assemble(bg))
	if calls.n.Load() != before || text(second, "rules") != "be brief" || len(second.Sections) != len(first.Sections) {
		t.Fatalf("%d calls for a kept answer: %v", calls.n.Load()-before, names(second.Sections))
	}
}

func TestWithoutTheLocalCacheEveryAssembleIsACall(t *testing.T) {
	calls := &assembleCalls{}
	client := connect(t, shared(t), calls.option())
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "be brief"))
	if _, made := assembledTwice(t, client, calls); made != 1 {
		t.Fatalf("the second assemble made %d calls", made)
	}
}

func TestEachKeptAnswerIsACopyTheCallerMayChange(t *testing.T) {
	client, _ := caching(t, startSidecar(t, nil))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "be brief"))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{Name: "search"}}}))
	must[*dsp.VariableHandle](t)(client.Variable(bg, "model", "m1"))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	kept := must[*dsp.Assembly](t)(client.Assemble(bg))
	kept.Sections = kept.Sections[:0]
	kept.Tools[0].Name = "changed"
	for _, v := range kept.Variables {
		*v.Value = "changed"
	}
	second := must[*dsp.Assembly](t)(client.Assemble(bg))
	if text(second, "rules") != "be brief" || second.Tools[0].Name != "search" || *second.Variables[0].Value != "m1" {
		t.Fatalf("the caller's changes reached the kept answer: %+v", second)
	}
}

func TestAScopeWithAProviderIsAskedEveryTime(t *testing.T) {
	client, calls := caching(t, shared(t))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "clock", 10, cachedText))
	if _, made := assembledTwice(t, client, calls); made != 1 {
		t.Fatalf("the second assemble made %d calls", made)
	}
}

func TestAStaticScopeIsKeptOnceWhateverTheFields(t *testing.T) {
	// An all-static plan ignores the fields, as the sidecar's kept answers know (issue 34, item 10).
	client, calls := caching(t, startSidecar(t, nil))
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithFields(map[string]any{"turn": 0})))
	before := calls.n.Load()
	for turn := 1; turn < 256; turn++ {
		must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithFields(map[string]any{"turn": turn})))
	}
	if made := calls.n.Load() - before; made != 0 {
		t.Fatalf("255 other fields of a static scope made %d calls", made)
	}
}

func TestAnotherScopesChurnLeavesTheKeptAnswer(t *testing.T) {
	// Issue 34, item 6: bob's register/dispose pairs in his own scope are in no layer alice's answer read.
	s := startSidecar(t, nil)
	client, calls := caching(t, s)
	alice, bob := connect(t, s), connect(t, s)
	must[*dsp.Scope](t)(alice.Scope(bg, "team"))
	mine := must[*dsp.Scope](t)(alice.Scope(bg, "alice", dsp.WithParent("team")))
	his := must[*dsp.Scope](t)(bob.Scope(bg, "bob", dsp.WithParent("team")))
	must[*dsp.Handle[string]](t)(mine.Section(bg, "rules", 10, "alice's"))
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("alice")))
	before := calls.n.Load()
	for i := 0; i < 20; i++ {
		handle := must[*dsp.Handle[string]](t)(his.Section(bg, fmt.Sprintf("churn-%d", i), 5, "bob's"))
		must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("alice")))
		if err := handle.Dispose(bg); err != nil {
			t.Fatal(err)
		}
		if got := text(must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("alice"))), "rules"); got != "alice's" {
			t.Fatalf("rules: %q", got)
		}
	}
	if made := calls.n.Load() - before; made != 0 {
		t.Fatalf("bob's churn made alice's kept answer ask %d times", made)
	}
	// a change of its parent's layer still reaches it
	team := must[*dsp.Scope](t)(alice.Scope(bg, "team"))
	must[*dsp.Handle[string]](t)(team.Section(bg, "parent", 5, "team's"))
	sees(t, client, "parent", "team's", dsp.ForScope("alice"))
}

func TestWhatIsKeptIsBoundedByLocalCacheBytes(t *testing.T) {
	s := startSidecar(t, nil)
	owner := connect(t, s)
	for key, size := range map[string]int{"a": 60_000, "b": 60_000, "huge": 200_000} {
		scope := must[*dsp.Scope](t)(owner.Scope(bg, key))
		must[*dsp.Handle[string]](t)(scope.Section(bg, "text", 1, strings.Repeat(key[:1], size)))
	}
	client, calls := caching(t, s, dsp.WithLocalCacheBytes(100_000))
	if _, made := assembledTwice(t, client, calls, dsp.ForScope("a")); made != 0 {
		t.Fatalf("a: %d calls", made)
	}
	if _, made := assembledTwice(t, client, calls, dsp.ForScope("b")); made != 0 {
		t.Fatalf("b: %d calls", made)
	}
	before := calls.n.Load()
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("a")))
	if calls.n.Load() != before+1 {
		t.Fatal("a was kept beside b over 100,000 bytes")
	}
	if _, made := assembledTwice(t, client, calls, dsp.ForScope("huge")); made != 1 {
		t.Fatalf("an answer over the whole budget: the second assemble made %d calls", made)
	}
}

func TestAnAssembleWithAReportIsAlwaysACall(t *testing.T) {
	client, calls := caching(t, shared(t))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	before := calls.n.Load()
	var report dsp.AssemblyReport
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.WithReport(&report)))
	must[*dsp.Rendered](t)(client.Render(bg))
	if calls.n.Load() != before+2 || len(report.Parts) == 0 {
		t.Fatalf("%d calls for a report and a render; the report: %+v", calls.n.Load()-before, report)
	}
}

// Read-your-writes: the revision in the client's own replies.

func TestAnOwnUpdateRegistrationDisposalAndListenerAreSeenByTheNextAssemble(t *testing.T) {
	client, _ := caching(t, shared(t))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	rules := must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "be brief"))
	wantText(t, client, "rules", "be brief")
	must[uint64](t)(rules.Update(bg, "be thorough"))
	wantText(t, client, "rules", "be thorough")
	check(t, rules.Dispose(bg))
	wantText(t, client, "rules", "<absent>")
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "shout", Text: "LOUD"})
		return next.Tail(a)
	}))
	wantText(t, client, "shout", "LOUD")
	scope := must[*dsp.Scope](t)(client.Scope(bg, "agent"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "mine", 10, "agent's"))
	if text(must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("agent"))), "mine") != "agent's" {
		t.Fatal("the scope's own section is missing")
	}
	check(t, scope.Dispose(bg)) // a scope's disposal: its section goes with it
	if got := text(must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("agent"))), "mine"); got != "<absent>" {
		t.Fatalf("the disposed scope's section is still served: %q", got)
	}
}

// Others' writes: the change stream.

// sees waits until client's assembly for scope has text under name.
func sees(t *testing.T, client *dsp.Client, name, want string, opts ...dsp.AssembleOption) {
	t.Helper()
	waitFor(t, name+" reading "+want, func() bool {
		assembly, err := client.Assemble(bg, opts...)
		return err == nil && text(assembly, name) == want
	})
}

func TestAnotherClientsUpdateReachesTheKeptAnswer(t *testing.T) {
	s := startSidecar(t, nil)
	client, _ := caching(t, s)
	other := connect(t, s)
	rules := must[*dsp.Handle[string]](t)(other.Section(bg, "rules", 10, "be brief"))
	sees(t, client, "rules", "be brief")
	must[uint64](t)(rules.Update(bg, "be thorough"))
	sees(t, client, "rules", "be thorough")
}

func TestAnotherSessionsEndReachesTheKeptAnswer(t *testing.T) {
	s := startSidecar(t, nil)
	client, _ := caching(t, s)
	other := connect(t, s)
	must[*dsp.Handle[string]](t)(other.Section(bg, "rules", 10, "be brief"))
	sees(t, client, "rules", "be brief")
	other.Close()
	sees(t, client, "rules", "<absent>")
}

func TestAReParentedScopeIsAssembledUnderItsNewParent(t *testing.T) {
	s := startSidecar(t, nil)
	client, _ := caching(t, s)
	other := connect(t, s)
	teamA := must[*dsp.Scope](t)(other.Scope(bg, "team-a"))
	teamB := must[*dsp.Scope](t)(other.Scope(bg, "team-b"))
	must[*dsp.Handle[string]](t)(teamA.Section(bg, "team", 10, "a"))
	must[*dsp.Handle[string]](t)(teamB.Section(bg, "team", 10, "b"))
	worker := must[*dsp.Scope](t)(other.Scope(bg, "worker", dsp.WithParent("team-a")))
	sees(t, client, "team", "a", dsp.ForScope("worker"))
	check(t, worker.Dispose(bg))
	must[*dsp.Scope](t)(other.Scope(bg, "worker", dsp.WithParent("team-b")))
	sees(t, client, "team", "b", dsp.ForScope("worker"))
}

func TestASidecarRestartLeavesNoAnswerOfTheOldOne(t *testing.T) {
	s, restart := restartable(t)
	owner := connect(t, s, dsp.WithCallTimeout(2*time.Second))
	rules := must[*dsp.Handle[string]](t)(owner.Section(bg, "rules", 10, "v0"))
	client, _ := caching(t, s, dsp.WithCallTimeout(2*time.Second))
	for version := 1; version < 20; version++ { // the old revision far above the new sidecar's
		must[uint64](t)(rules.Update(bg, fmt.Sprint("v", version)))
	}
	sees(t, client, "rules", "v19")
	restart()
	waitFor(t, "the owner's replay", owner.Connected)
	waitFor(t, "the caching client's reconnect", client.Connected)
	must[uint64](t)(rules.Update(within(t, 10*time.Second), "after the restart"))
	sees(t, client, "rules", "after the restart")
}
