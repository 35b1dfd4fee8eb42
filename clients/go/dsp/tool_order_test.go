package dsp_test

import (
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// The report's tool order (docs/prompt-cache.md, "A stable tool order"), on a
// real sidecar keeping a stable order; each test has scopes and keys of its own.

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
