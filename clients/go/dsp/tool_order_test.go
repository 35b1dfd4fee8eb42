package dsp_test

import (
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// The report's tool order and the tool freeze (docs/prompt-cache.md, "A stable
// tool order", "Freezing the tools"), on a real sidecar keeping a stable order;
// each test has scopes and keys of its own.

var stableOrder = []string{`tool_order_mode = "stable"`}

// addTools registers static tools with these names (and no parameters) in scope.
func addTools(t *testing.T, scope *dsp.Scope, names ...string) *dsp.Handle[dsp.ToolProviderResult] {
	t.Helper()
	schemas := make([]dsp.ToolSchema, len(names))
	for i, name := range names {
		schemas[i] = dsp.ToolSchema{Name: name, Description: "The " + name + " tool."}
	}
	return must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.Tools(bg, dsp.ToolProviderResult{Schemas: schemas}))
}

func TestAStableReportSaysWhereSortingWouldHaveBrokenTheTools(t *testing.T) {
	client := connect(t, sharedWith(t, stableOrder))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-order-stable"))
	addTools(t, scope, "bash", "read", "write")
	reported := []dsp.AssembleOption{dsp.ForScope("go-order-stable"), dsp.WithReportKey("go-order-conv")}

	first := reportOf(t, client, reported...)
	if first.ToolOrder == nil || *first.ToolOrder != (dsp.ToolOrderReport{}) {
		t.Fatalf("the first report's tool order (sorted so far): %+v", first.ToolOrder)
	}
	addTools(t, scope, "mcp__fs__abc")
	second := reportOf(t, client, reported...)
	want := dsp.ToolOrderReport{Kept: true, Position: 1, SortedTool: "mcp__fs__abc", KeptTool: "read"}
	if second.ToolOrder == nil || *second.ToolOrder != want {
		t.Fatalf("the second report's tool order: %+v", second.ToolOrder)
	}
	third := must[*dsp.Assembly](t)(client.Assemble(bg, append(reported, dsp.WithReport(&dsp.AssemblyReport{}))...))
	equal(t, toolNames(third), []string{"bash", "read", "write", "mcp__fs__abc"})

	sorted := connect(t, shared(t)) // the default mode keeps no order: no ToolOrder
	addTools(t, must[*dsp.Scope](t)(sorted.Scope(bg, "go-order-sorted")), "bash")
	if report := reportOf(t, sorted, dsp.ForScope("go-order-sorted")); report.ToolOrder != nil {
		t.Fatalf("a sorted report's tool order: %+v", report.ToolOrder)
	}
}

func TestAToolFreezeRefusesOtherToolsUntilReleased(t *testing.T) {
	client := connect(t, sharedWith(t, stableOrder))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "go-freeze"))
	addTools(t, scope, "bash", "read")
	var report dsp.AssemblyReport
	keyed := []dsp.AssembleOption{dsp.ForScope("go-freeze"), dsp.WithReportKey("go-freeze-conv"), dsp.WithReport(&report)}
	must[*dsp.Assembly](t)(client.Assemble(bg, append(keyed, dsp.WithToolFreeze(dsp.ToolFreezeHold))...))

	addTools(t, scope, "abc")
	_, err := client.Assemble(bg, keyed...)
	want := `the tools of key "go-freeze-conv" are frozen since its report 1: tool "abc" would be added` +
		" (release them with tool_freeze RELEASE to change them)"
	if failed := failure(t, err); failed.Code != codes.FailedPrecondition || failed.Reason != dsp.ReasonToolsFrozen ||
		failed.Message != want {
		t.Fatalf("the frozen key's refusal: %+v", failed)
	}
	released := must[*dsp.Rendered](t)(client.Render(bg, append(keyed, dsp.WithToolFreeze(dsp.ToolFreezeRelease))...))
	equal(t, toolNames(released.Assembly), []string{"bash", "read", "abc"})
	if order := (dsp.ToolOrderReport{Kept: true, SortedTool: "abc", KeptTool: "bash"}); report.ToolOrder == nil || *report.ToolOrder != order {
		t.Fatalf("the released report's tool order: %+v", report.ToolOrder)
	}
}

func TestAToolFreezeNeedsAReportAndAKnownValue(t *testing.T) {
	s := sharedWith(t, stableOrder)
	must[*dsp.Scope](t)(connect(t, s).Scope(bg, "go-freeze-refused"))
	// a local cache keeps the scope's answer, yet a freeze goes to the sidecar, which refuses it
	client := connect(t, s, dsp.WithLocalCache())
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("go-freeze-refused")))
	_, err := client.Assemble(bg, dsp.ForScope("go-freeze-refused"), dsp.WithToolFreeze(dsp.ToolFreezeHold))
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue ||
		!strings.HasPrefix(failed.Message, "tool_freeze needs report = true") {
		t.Fatalf("a freeze without a report: %+v", failed)
	}
	_, err = client.Assemble(bg, dsp.WithReport(&dsp.AssemblyReport{}), dsp.WithToolFreeze("keep"))
	if failed := failure(t, err); failed.Code != codes.InvalidArgument || failed.Reason != dsp.ReasonInvalidValue ||
		failed.Message != `tool freeze must be "hold" or "release", not "keep"` {
		t.Fatalf("an unknown freeze: %+v", failed)
	}
}
