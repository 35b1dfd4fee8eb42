package dsp_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// The local cache of an agent that may read only its own scopes (issue 34, item 8),
// the Go twin of tests/client/test_local_cache_reach.py's: its watch of every change
// is PERMISSION_DENIED, so it watches each scope it assembles, filtered to that
// scope's chain.

const adminToken, agentToken = "admin-token-0123", "alice-token-4567"

// guarded is a sidecar with an admin and an agent that may read scopes "team", "alice" and "solo".
func guarded(t *testing.T) *sidecar {
	t.Helper()
	folder := t.TempDir()
	admin, agent := filepath.Join(folder, "admin.token"), filepath.Join(folder, "alice.token")
	check(t, os.WriteFile(admin, []byte(adminToken), 0o600))
	check(t, os.WriteFile(agent, []byte(agentToken), 0o600))
	return startSidecar(t, []string{
		fmt.Sprintf("auth_token_file = %q", admin),
		"[[credentials]]", `name = "alice"`, `role = "agent"`,
		fmt.Sprintf("token_file = %q", agent), `scopes = ["team", "alice", "solo"]`,
	})
}

// keptAnswer tells whether scope's second Assemble in a row is answered without a call.
func keptAnswer(t *testing.T, client *dsp.Client, calls *assembleCalls, scope string) bool {
	t.Helper()
	_, made := assembledTwice(t, client, calls, dsp.ForScope(scope))
	return made == 0
}

func TestAnAgentListingItsScopesKeepsAnswersWatchingEach(t *testing.T) {
	s := guarded(t)
	admin := connect(t, s, dsp.WithToken(adminToken))
	team := must[*dsp.Scope](t)(admin.Scope(bg, "team"))
	alice := must[*dsp.Scope](t)(admin.Scope(bg, "alice", dsp.WithParent("team")))
	must[*dsp.Handle[string]](t)(alice.Section(bg, "rules", 10, "alice's"))
	bob := must[*dsp.Scope](t)(admin.Scope(bg, "bob"))
	must[*dsp.Handle[string]](t)(bob.Section(bg, "rules", 10, "bob's"))

	agent, calls := caching(t, s, dsp.WithToken(agentToken)) // refused the watch of every change before
	waitFor(t, "a kept answer", func() bool { return keptAnswer(t, agent, calls, "alice") })
	must[*dsp.Handle[string]](t)(team.Section(bg, "parent", 5, "team's"))
	sees(t, agent, "parent", "team's", dsp.ForScope("alice")) // the parent's change reaches it
	waitFor(t, "a kept answer again", func() bool { return keptAnswer(t, agent, calls, "alice") })

	before := calls.n.Load()
	for number := 0; number < 10; number++ { // churn in a scope outside the agent's chain leaves its answer
		churn := must[*dsp.Handle[string]](t)(bob.Section(bg, fmt.Sprint("churn-", number), 5, "bob's"))
		check(t, churn.Dispose(bg))
		if text(must[*dsp.Assembly](t)(agent.Assemble(bg, dsp.ForScope("alice"))), "rules") != "alice's" {
			t.Fatal("alice's kept answer changed")
		}
	}
	if made := calls.n.Load() - before; made != 0 {
		t.Fatalf("bob's churn made %d calls for alice's scope", made)
	}

	_, err := agent.Assemble(bg, dsp.ForScope("bob"))
	if failure(t, err).Code != codes.PermissionDenied {
		t.Fatalf("a scope the agent may not read: %v", err)
	}
}

func TestAGlobalStepMadeOutsideAnAgentsScopesReachesItsKeptAnswer(t *testing.T) {
	s := guarded(t)
	admin := connect(t, s, dsp.WithToken(adminToken))
	must[*dsp.Scope](t)(admin.Scope(bg, "team"))
	alice := must[*dsp.Scope](t)(admin.Scope(bg, "alice", dsp.WithParent("team")))
	must[*dsp.Handle[string]](t)(alice.Section(bg, "rules", 10, "alice's"))
	bob := must[*dsp.Scope](t)(admin.Scope(bg, "bob"))
	agent, calls := caching(t, s, dsp.WithToken(agentToken))
	waitFor(t, "a kept answer", func() bool { return keptAnswer(t, agent, calls, "alice") })
	// registered with Global in bob's layer, it runs for alice's assemblies too: the
	// agent's watch of alice's chain is told of it
	must[*dsp.Registration](t)(bob.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "marked", Text: "by the admin"})
		return next.Tail(a)
	}, dsp.Global()))
	sees(t, agent, "marked", "by the admin", dsp.ForScope("alice"))
	// its listing of alice's chain shows the step as its watch did: global, without its name
	listed := must[*dsp.Snapshot](t)(agent.Snapshot(bg, dsp.InScope("alice", true), dsp.OfKinds(dsp.ChangeKindListener)))
	if len(listed.Registrations) != 1 || !listed.Registrations[0].Global || listed.Registrations[0].Name != "" || listed.Registrations[0].Scope != "" {
		t.Fatalf("the agent's listing of alice's chain: %+v", listed.Registrations)
	}
}

// forgetsItsParent: "solo" is bound under "upper" and held to the end only as the
// parent of "kid"; once "kid" goes, nothing holds "solo" and its binding goes with
// it, so its chain is itself alone though no event of its own layer says so. The
// sidecar names it in the event's ReboundScopes, so neither its kept answers (the
// owner's Assemble) nor cache serve "upper"'s section on.
func forgetsItsParent(t *testing.T, owner, cache *dsp.Client, calls *assembleCalls) {
	t.Helper()
	upper := must[*dsp.Scope](t)(owner.Scope(bg, "upper"))
	must[*dsp.Handle[string]](t)(upper.Section(bg, "upper", 5, "upper's"))
	kid := must[*dsp.Scope](t)(owner.Scope(bg, "kid", dsp.WithParent("solo")))
	check(t, must[*dsp.Scope](t)(owner.Scope(bg, "solo", dsp.WithParent("upper"))).Dispose(bg))
	waitFor(t, "a kept answer", func() bool { return keptAnswer(t, cache, calls, "solo") })
	if got := text(must[*dsp.Assembly](t)(cache.Assemble(bg, dsp.ForScope("solo"))), "upper"); got != "upper's" {
		t.Fatalf("solo under upper assembled upper's section as %q", got)
	}
	check(t, kid.Dispose(bg))
	if got := text(must[*dsp.Assembly](t)(owner.Assemble(bg, dsp.ForScope("solo"))), "upper"); got != "<absent>" {
		t.Fatalf("the sidecar assembled solo under its forgotten parent: %q", got)
	}
	sees(t, cache, "upper", "<absent>", dsp.ForScope("solo"))
}

func TestAScopeForgottenWithItsParentIsNotServedItsOldChain(t *testing.T) {
	s := startSidecar(t, nil)
	cache, calls := caching(t, s)
	forgetsItsParent(t, connect(t, s), cache, calls)
}

func TestAScopeForgottenWithItsParentIsNotServedToAnAgentWatchingIt(t *testing.T) {
	s := guarded(t)
	cache, calls := caching(t, s, dsp.WithToken(agentToken)) // its watch of solo's chain: kid's event re-bound solo
	forgetsItsParent(t, connect(t, s, dsp.WithToken(adminToken)), cache, calls)
}

// A listener or rule registered on bob's scope (not Global) runs for bob's
// assemblies only: its event says global false, so alice's kept answer stays
// (before, any step's event dropped every kept answer). The marker registered after
// it in carol's scope, once seen, tells that the step's event came first.
func TestAStepRegisteredOnAnotherScopeLeavesTheKeptAnswer(t *testing.T) {
	s := startSidecar(t, nil)
	cache, calls := caching(t, s)
	other := connect(t, s)
	alice := must[*dsp.Scope](t)(other.Scope(bg, "alice"))
	must[*dsp.Handle[string]](t)(alice.Section(bg, "rules", 10, "alice's"))
	bob := must[*dsp.Scope](t)(other.Scope(bg, "bob"))
	carol := must[*dsp.Scope](t)(other.Scope(bg, "carol"))
	waitFor(t, "a kept answer", func() bool { return keptAnswer(t, cache, calls, "alice") })
	must[*dsp.Registration](t)(bob.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		return next.Tail(a)
	}))
	must[*dsp.Handle[dsp.Rule]](t)(bob.Rule(bg, "mark", dsp.Rule{
		Mutations: []dsp.Mutation{dsp.DropSections("section.name == 'rules'")},
	}))
	must[*dsp.Handle[string]](t)(carol.Section(bg, "marker", 1, "after the steps"))
	sees(t, cache, "marker", "after the steps", dsp.ForScope("carol"))
	before := calls.n.Load()
	if got := text(must[*dsp.Assembly](t)(cache.Assemble(bg, dsp.ForScope("alice"))), "rules"); got != "alice's" {
		t.Fatalf("alice's rules read %q", got)
	}
	if made := calls.n.Load() - before; made != 0 {
		t.Fatalf("steps on bob's scope made %d calls for alice's kept answer", made)
	}
}
