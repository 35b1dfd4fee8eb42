package dsp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// The local cache's answers of a rules-only plan (cacheable_with_fields) on a real
// sidecar, the Go twin of clients/typescript/test/localCacheFields.test.ts: kept under
// the scope and the request's very fields, never served for other fields, counted in
// WithLocalCacheBytes, and gone with the rule's change, its session's end or a restart.

// greet is a rule that appends a section greeting fields.who, when it is set, with greeting.
func greet(greeting string) dsp.Rule {
	part := dsp.RulePart{Name: "greeting", Order: 50, Text: fmt.Sprintf("'%s ' + fields.who + '.'", greeting)}
	return dsp.Rule{Match: []string{"'who' in fields"}, Mutations: []dsp.Mutation{dsp.UpsertSections(part)}}
}

// greeting is the greeting section's text in client's assembly for who ("": no fields).
func greeting(t *testing.T, client *dsp.Client, who string, opts ...dsp.AssembleOption) string {
	t.Helper()
	if who != "" {
		opts = append(opts, dsp.WithFields(map[string]any{"who": who}))
	}
	return text(must[*dsp.Assembly](t)(client.Assemble(bg, opts...)), "greeting")
}

// greets waits until client's assembly for who greets with want.
func greets(t *testing.T, client *dsp.Client, who, want string) {
	t.Helper()
	sees(t, client, "greeting", want, dsp.WithFields(map[string]any{"who": who}))
}

// wantGreeting fails the test unless client's assembly for who greets with want.
func wantGreeting(t *testing.T, client *dsp.Client, who, want string, opts ...dsp.AssembleOption) {
	t.Helper()
	if got := greeting(t, client, who, opts...); got != want {
		t.Fatalf("for %q: %q, want %q", who, got, want)
	}
}

func TestARulesOnlyScopeIsKeptByItsFieldsEachValueWithItsOwnText(t *testing.T) {
	client, calls := caching(t, startSidecar(t, nil))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "be brief"))
	must[*dsp.Handle[dsp.Rule]](t)(client.Rule(bg, "greet", greet("Hello")))
	before := calls.n.Load()
	wantGreeting(t, client, "ada", "Hello ada.")
	wantGreeting(t, client, "bob", "Hello bob.") // not ada's, kept under other fields
	if made := calls.n.Load() - before; made != 2 {
		t.Fatalf("two fields made %d calls", made)
	}
	wantGreeting(t, client, "ada", "Hello ada.")
	wantGreeting(t, client, "bob", "Hello bob.")
	if made := calls.n.Load() - before; made != 2 {
		t.Fatalf("the repeats made %d calls", made-2)
	}
	wantGreeting(t, client, "", "<absent>") // no fields: its own answer
	wantGreeting(t, client, "eve", "Hello eve.")
	if made := calls.n.Load() - before; made != 4 {
		t.Fatalf("no fields and a new value made %d calls", made-2)
	}
}

func TestAScopeWithARuleAndAListenerIsAskedEveryTime(t *testing.T) {
	client, calls := caching(t, startSidecar(t, nil))
	must[*dsp.Handle[dsp.Rule]](t)(client.Rule(bg, "greet", greet("Hello")))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		return next.Tail(a)
	}))
	who := dsp.WithFields(map[string]any{"who": "ada"})
	if again, made := assembledTwice(t, client, calls, who); made != 1 || text(again, "greeting") != "Hello ada." {
		t.Fatalf("the second assemble made %d calls: %q", made, text(again, "greeting"))
	}
}

func TestARulesUpdateAndItsSessionsEndReachTheAnswersKeptByFields(t *testing.T) {
	s := startSidecar(t, nil)
	client, _ := caching(t, s)
	own := must[*dsp.Handle[dsp.Rule]](t)(client.Rule(bg, "own", greet("Hello")))
	wantGreeting(t, client, "ada", "Hello ada.")
	must[uint64](t)(own.Update(bg, greet("Hi")))
	wantGreeting(t, client, "ada", "Hi ada.") // read-your-writes
	check(t, own.Dispose(bg))
	other := connect(t, s)
	handle := must[*dsp.Handle[dsp.Rule]](t)(other.Rule(bg, "greet", greet("Hello")))
	greets(t, client, "ada", "Hello ada.")
	wantGreeting(t, client, "bob", "Hello bob.")
	must[uint64](t)(handle.Update(bg, greet("HELLO")))
	greets(t, client, "ada", "HELLO ada.")
	greets(t, client, "bob", "HELLO bob.")
	other.Close()
	greets(t, client, "ada", "<absent>")
}

func TestAnswersKeptByFieldsCountTowardLocalCacheBytes(t *testing.T) {
	s := startSidecar(t, nil)
	scope := must[*dsp.Scope](t)(connect(t, s).Scope(bg, "budget"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "text", 1, strings.Repeat("x", 60_000)))
	must[*dsp.Handle[dsp.Rule]](t)(scope.Rule(bg, "greet", greet("Hello")))
	client, calls := caching(t, s, dsp.WithLocalCacheBytes(100_000))
	in := dsp.ForScope("budget")
	if _, made := assembledTwice(t, client, calls, in, dsp.WithFields(map[string]any{"who": "ada"})); made != 0 {
		t.Fatalf("ada: %d calls", made)
	}
	if _, made := assembledTwice(t, client, calls, in, dsp.WithFields(map[string]any{"who": "bob"})); made != 0 {
		t.Fatalf("bob: %d calls", made)
	}
	before := calls.n.Load()
	wantGreeting(t, client, "ada", "Hello ada.", in)
	if calls.n.Load() != before+1 {
		t.Fatal("ada's answer was kept beside bob's over 100,000 bytes")
	}
}

func TestASidecarRestartLeavesNoAnswerKeptByFieldsOfTheOldOne(t *testing.T) {
	s, restart := restartable(t)
	owner := connect(t, s, dsp.WithCallTimeout(2*time.Second))
	rule := must[*dsp.Handle[dsp.Rule]](t)(owner.Rule(bg, "greet", greet("v0")))
	client, _ := caching(t, s, dsp.WithCallTimeout(2*time.Second))
	for version := 1; version < 20; version++ { // the old revision far above the new sidecar's
		must[uint64](t)(rule.Update(bg, greet(fmt.Sprint("v", version))))
	}
	greets(t, client, "ada", "v19 ada.")
	restart()
	waitFor(t, "the owner's replay", owner.Connected)
	waitFor(t, "the caching client's reconnect", client.Connected)
	must[uint64](t)(rule.Update(within(t, 10*time.Second), greet("after")))
	greets(t, client, "ada", "after ada.")
}
