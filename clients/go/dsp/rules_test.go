package dsp_test

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// The rules API (docs/protocol.md, "Rules"): Rule with the Mutation constructors,
// its handle's Update and Dispose, Prepend and Global, the listing's value, and the
// refusals of the client and of the sidecar, on a real sidecar.

func goRuleTools() dsp.ToolProviderResult {
	return dsp.Schemas(dsp.ToolSchema{Name: "bash"}, dsp.ToolSchema{Name: "mcp__github__issue"},
		dsp.ToolSchema{Name: "todo_write"}, dsp.ToolSchema{Name: "web_fetch"})
}

func TestEveryMutationKindMatchAndVariablesApplyAsTheSidecarRunsThem(t *testing.T) {
	client := connect(t, shared(t))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-rules-all"))
	check(t, agent.Register(bg).
		Tools(goRuleTools()).
		Section("intro", 10, "Hello.").
		Section("outro", 30, "Bye.").
		Context("clock", 10, "noon").
		Context("cwd", 20, "/work").
		Variable("model", "v3").
		Variable("region", "eu").
		Rule("all", dsp.Rule{
			Match:     []string{"'agent' in fields"},
			Variables: []dsp.RuleVariable{{Name: "agent", Expression: "fields.agent"}},
			Mutations: []dsp.Mutation{
				dsp.DropTools("tool.name.startsWith('web_')"),
				dsp.KeepTools("tool.name != 'todo_write'"),
				dsp.OrderTools("mcp__github__issue"),
				dsp.UpsertSections(dsp.RulePart{Name: "who", Order: 20, Text: "'Agent ' + variables.agent"}),
				dsp.DropSections("section.name == 'outro'"),
				dsp.UpsertContexts(dsp.RulePart{Name: "cwd", Order: 0, Text: "'/elsewhere'"}),
				dsp.DropContexts("context.name == 'clock'"),
				dsp.SetVariables(dsp.RuleValue{Name: "model", Expression: "'v4-' + variables.agent"},
					dsp.RuleValue{Name: "region", Unset: true}),
			},
		}).
		Err())
	untouched := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-rules-all")))
	equal(t, toolNames(untouched), []string{"bash", "mcp__github__issue", "todo_write", "web_fetch"})
	a := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-rules-all"),
		dsp.WithFields(map[string]any{"agent": "ada"})))
	equal(t, toolNames(a), []string{"mcp__github__issue", "bash"})
	equal(t, names(a.Sections), []string{"intro", "who"})
	equal(t, names(a.Contexts), []string{"cwd"})
	if text(a, "who") != "Agent ada" || text(a, "cwd") != "/elsewhere" {
		t.Fatalf("parts: %v %v", a.Sections, a.Contexts)
	}
	values := map[string]string{}
	for _, v := range a.Variables {
		values[v.Name] = "<none>"
		if v.Value != nil {
			values[v.Name] = *v.Value
		}
	}
	if !reflect.DeepEqual(values, map[string]string{"model": "v4-ada", "region": "<none>"}) {
		t.Fatalf("variables: %v", values)
	}
}

func TestAScopesRuleIsUpdatedInPlaceAndDisposedThroughItsHandle(t *testing.T) {
	client := connect(t, shared(t))
	check(t, client.Register(bg).Tools(dsp.Schemas(dsp.ToolSchema{Name: "go_a"}, dsp.ToolSchema{Name: "go_b"})).Err())
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-rules-handle"))
	handle := must[*dsp.Handle[dsp.Rule]](t)(agent.Rule(bg, "one", dsp.Rule{
		Mutations: []dsp.Mutation{dsp.DropTools("tool.name.startsWith('go_') && tool.name != 'go_b'")},
	}))
	scoped := func() []string {
		a := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-rules-handle")))
		kept := []string{}
		for _, name := range toolNames(a) {
			if strings.HasPrefix(name, "go_") {
				kept = append(kept, name)
			}
		}
		return kept
	}
	equal(t, scoped(), []string{"go_b"})
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg, dsp.InScope("go-rules-handle", false),
		dsp.OfKinds(dsp.ChangeKindRule)))
	defer changes.Close()
	must[uint64](t)(handle.Update(bg, dsp.Rule{Mutations: []dsp.Mutation{dsp.DropTools("tool.name == 'go_b'")}}))
	event, ok := must[dsp.Change](t)(changes.Next(within(t, 10e9))).(dsp.ChangeEvent)
	if !ok || event.Action != dsp.ChangeActionUpdated || event.Kind != dsp.ChangeKindRule || event.Name != "one" {
		t.Fatalf("event: %+v", event)
	}
	equal(t, scoped(), []string{"go_a"})
	check(t, handle.Dispose(bg))
	equal(t, scoped(), []string{"go_a", "go_b"})
}

func TestPrependAndGlobalPlaceARuleAmongTheWaterfallsSteps(t *testing.T) {
	client := connect(t, shared(t))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-rules-order"))
	upsert := func(text string) dsp.Rule {
		return dsp.Rule{Mutations: []dsp.Mutation{dsp.UpsertSections(dsp.RulePart{Name: "go-last", Order: 99, Text: text})}}
	}
	must[*dsp.Handle[dsp.Rule]](t)(agent.Rule(bg, "later", upsert("'later'"), dsp.Global()))
	must[*dsp.Handle[dsp.Rule]](t)(agent.Rule(bg, "first", upsert("'first'"), dsp.Prepend()))
	// "first" is prepended, so runs before "later": "later" has the last word, in its scope.
	a := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-rules-order")))
	if got := text(a, "go-last"); got != "later" {
		t.Fatalf("in the scope: %q", got)
	}
	// Global: "later" runs in every assembly; "first", scoped, does not.
	other := must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-rules-elsewhere")))
	if got := text(other, "go-last"); got != "later" {
		t.Fatalf("elsewhere: %q", got)
	}
}

func TestAListingReadsARuleBackAsItWasGiven(t *testing.T) {
	client := connect(t, shared(t))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-rules-listed"))
	rule := dsp.Rule{
		Mutations:     []dsp.Mutation{dsp.OrderTools("a", "b"), dsp.SetVariables(dsp.RuleValue{Name: "w", Unset: true})},
		Match:         []string{"true"},
		Variables:     []dsp.RuleVariable{{Name: "n", Expression: "1"}},
		FailurePolicy: dsp.FailurePolicyIgnore,
	}
	must[*dsp.Handle[dsp.Rule]](t)(agent.Rule(bg, "listed", rule))
	snapshot := must[*dsp.Snapshot](t)(client.Snapshot(bg, dsp.InScope("go-rules-listed", false),
		dsp.OfKinds(dsp.ChangeKindRule), dsp.WithValues()))
	if len(snapshot.Registrations) != 1 || snapshot.Registrations[0].Rule == nil {
		t.Fatalf("listing: %+v", snapshot.Registrations)
	}
	listed := *snapshot.Registrations[0].Rule
	again := must[*dsp.Handle[dsp.Rule]](t)(agent.Rule(bg, "again", listed)) // what is read back registers as is
	check(t, again.Dispose(bg))
	if !reflect.DeepEqual(listed.Match, rule.Match) || !reflect.DeepEqual(listed.Variables, rule.Variables) ||
		listed.FailurePolicy != rule.FailurePolicy || len(listed.Mutations) != 2 {
		t.Fatalf("listed %+v, given %+v", listed, rule)
	}
}

func TestAMalformedRuleIsRefusedInTheClientAndABadExpressionByTheSidecar(t *testing.T) {
	client := connect(t, shared(t))
	for _, c := range []struct {
		rule dsp.Rule
		want string
	}{
		{dsp.Rule{Mutations: []dsp.Mutation{{}}}, "a rule's Mutations[0] is a zero Mutation"},
		{dsp.Rule{FailurePolicy: "maybe"}, `a rule's FailurePolicy is FailurePolicyFail or FailurePolicyIgnore, not "maybe"`},
		{dsp.Rule{Mutations: []dsp.Mutation{dsp.UpsertSections(dsp.RulePart{Name: "s", Order: math.NaN(), Text: "'x'"})}},
			"a rule part's order must be finite, not NaN"},
	} {
		_, err := client.Rule(bg, "r", c.rule)
		refused := failure(t, err)
		if refused.Reason != dsp.ReasonInvalidValue || !strings.HasPrefix(refused.Message, c.want) {
			t.Fatalf("%s: %s", refused.Reason, refused.Message)
		}
	}
	_, err := client.Rule(bg, "typo", dsp.Rule{Mutations: []dsp.Mutation{dsp.DropTools("tool.nme == 'x'")}})
	refused := failure(t, err)
	want := `rule "typo": mutations[0].drop_tools:1:5: undefined field 'nme'`
	if refused.Reason != dsp.ReasonRuleInvalid || !strings.HasPrefix(refused.Message, want) {
		t.Fatalf("%s: %s", refused.Reason, refused.Message)
	}
}

func TestARuleFailingAtRunTimeFailsTheAssemblyOrIsSkippedUnderIgnore(t *testing.T) {
	client := connect(t, shared(t))
	agent := must[*dsp.Scope](t)(client.Scope(bg, "go-rules-fails"))
	handle := must[*dsp.Handle[dsp.Rule]](t)(agent.Rule(bg, "boom", dsp.Rule{Match: []string{"fields.absent == 1"}}))
	_, err := client.Assemble(bg, dsp.ForScope("go-rules-fails"))
	refused := failure(t, err)
	if refused.Reason != dsp.ReasonRuleFailed || refused.Message != `rule "boom" failed: match[0]: Key not found in map : "absent"` {
		t.Fatalf("%s: %s", refused.Reason, refused.Message)
	}
	must[uint64](t)(handle.Update(bg, dsp.Rule{Match: []string{"fields.absent == 1"}, FailurePolicy: dsp.FailurePolicyIgnore}))
	var skipped []dsp.SkippedStep
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-rules-fails"), dsp.WithSkipped(&skipped)))
	if len(skipped) != 1 || skipped[0].Kind != dsp.ChangeKindRule || skipped[0].Name != "boom" || skipped[0].Reason != dsp.ReasonRuleFailed {
		t.Fatalf("skipped: %+v", skipped)
	}
}
