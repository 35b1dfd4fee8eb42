package dsp

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// Every proto enum the API exposes has a Go type of string constants, one per
// value besides UNSPECIFIED, named and spelt for it (ChangeKindSection =
// "section" for CHANGE_KIND_SECTION, PrefixLayoutToolsFirst = "tools-first"
// for PREFIX_LAYOUT_TOOLS_FIRST), and the client converts each value to its
// constant and back: a value added to the proto fails here until it has one.

// exposedEnum is one proto enum as the API exposes it.
type exposedEnum struct {
	goType string
	prefix string           // the values' prefix in the proto: "CHANGE_KIND_"
	values map[string]int32 // the generated enum's names and numbers
	// fromWire is the client's name for a number ("" when the API never reads it).
	fromWire func(int32) string
	// toWire is the number the client sends for a name (nil when the API never sends it).
	toWire  func(string) (int32, bool)
	unknown bool // a <Type>Unknown constant names a number this package does not know
}

func exposedEnums() []exposedEnum {
	return []exposedEnum{
		{goType: "ChangeKind", prefix: "CHANGE_KIND_", values: pb.ChangeKind_value, unknown: true,
			fromWire: func(n int32) string { return string(kindFromProto(pb.ChangeKind(n))) },
			toWire: func(name string) (int32, bool) {
				kinds := collect([]WatchOption{OfKinds(ChangeKind(name))}).filter.Kinds
				if len(kinds) != 1 {
					return 0, false
				}
				return int32(kinds[0]), true
			}},
		{goType: "ChangeAction", prefix: "CHANGE_ACTION_", values: pb.ChangeAction_value, unknown: true,
			fromWire: func(n int32) string { return string(actionFromProto(pb.ChangeAction(n))) }},
		{goType: "PartKind", prefix: "PART_KIND_", values: pb.PartKind_value, unknown: true,
			fromWire: func(n int32) string { return string(named(partKinds, pb.PartKind(n), PartKindUnknown)) }},
		{goType: "SourceKind", prefix: "SOURCE_KIND_", values: pb.SourceKind_value, unknown: true,
			fromWire: func(n int32) string { return string(named(sourceKinds, pb.SourceKind(n), SourceKindUnknown)) }},
		{goType: "PrefixLayout", prefix: "PREFIX_LAYOUT_", values: pb.PrefixLayout_value,
			fromWire: func(n int32) string { return string(layoutFromProto(pb.PrefixLayout(n))) },
			toWire: func(name string) (int32, bool) {
				n, ok := layoutToProto(PrefixLayout(name))
				return int32(n), ok
			}},
		{goType: "ToolFreeze", prefix: "TOOL_FREEZE_", values: pb.ToolFreeze_value,
			toWire: func(name string) (int32, bool) {
				n, ok := toolFreezes[ToolFreeze(name)]
				return int32(n), ok
			}},
		{goType: "FailurePolicy", prefix: "FAILURE_POLICY_", values: pb.FailurePolicy_value,
			toWire: func(name string) (int32, bool) {
				n, ok := failurePolicies[FailurePolicy(name)]
				return int32(n), ok
			}},
	}
}

// typedConstants reads the package's constants of each named type: type to name to value.
func typedConstants(t *testing.T) map[string]map[string]string {
	t.Helper()
	constants := map[string]map[string]string{}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range entries {
		if !strings.HasSuffix(entry.Name(), ".go") || strings.HasSuffix(entry.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(gotoken.NewFileSet(), entry.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != gotoken.CONST {
				continue
			}
			for _, spec := range gen.Specs {
				value := spec.(*ast.ValueSpec)
				typ, ok := value.Type.(*ast.Ident)
				if !ok {
					continue
				}
				for i, name := range value.Names {
					literal, ok := value.Values[i].(*ast.BasicLit)
					if !ok || literal.Kind != gotoken.STRING {
						continue
					}
					text, err := strconv.Unquote(literal.Value)
					if err != nil {
						t.Fatal(err)
					}
					if constants[typ.Name] == nil {
						constants[typ.Name] = map[string]string{}
					}
					constants[typ.Name][name.Name] = text
				}
			}
		}
	}
	return constants
}

// spelt is a value's name as the client spells it: CHANGE_KIND_SECTION is
// "section", PREFIX_LAYOUT_TOOLS_FIRST "tools-first".
func spelt(value, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(value, prefix)), "_", "-")
}

// constantName is the constant's name for a value: ChangeKindSection, PrefixLayoutToolsFirst.
func constantName(goType, value, prefix string) string {
	name := goType
	for _, word := range strings.Split(strings.TrimPrefix(value, prefix), "_") {
		name += word[:1] + strings.ToLower(word[1:])
	}
	return name
}

func TestEveryExposedProtoEnumHasAConstantPerValue(t *testing.T) {
	constants := typedConstants(t)
	for _, enum := range exposedEnums() {
		ofType := constants[enum.goType]
		expected := map[string]string{}
		for value, number := range enum.values {
			if number == 0 {
				continue // UNSPECIFIED: the wire's "not set", never a client's value
			}
			name, spelling := constantName(enum.goType, value, enum.prefix), spelt(value, enum.prefix)
			expected[name] = spelling
			if got, ok := ofType[name]; !ok {
				t.Errorf("%s has no constant %s for the proto's %s", enum.goType, name, value)
			} else if got != spelling {
				t.Errorf("%s = %q, want %q (the proto's %s)", name, got, spelling, value)
			}
			if enum.fromWire != nil && enum.fromWire(number) != spelling {
				t.Errorf("the client reads the proto's %s as %q, want %s", value, enum.fromWire(number), name)
			}
			if enum.toWire != nil {
				if sent, ok := enum.toWire(spelling); !ok || sent != number {
					t.Errorf("the client sends %s as %d (%v), want %s = %d", name, sent, ok, value, number)
				}
			}
		}
		if enum.unknown {
			expected[enum.goType+"Unknown"] = "unknown"
			if ofType[enum.goType+"Unknown"] != "unknown" {
				t.Errorf("%s has no %sUnknown = \"unknown\" for a newer sidecar's value", enum.goType, enum.goType)
			}
			if got := enum.fromWire(1 << 20); got != "unknown" {
				t.Errorf("the client reads a %s it does not know as %q, want \"unknown\"", enum.goType, got)
			}
		}
		extra := []string{}
		for name := range ofType {
			if _, ok := expected[name]; !ok {
				extra = append(extra, name)
			}
		}
		sort.Strings(extra)
		if len(extra) > 0 {
			t.Errorf("%s constants naming no value of the proto's enum: %v", enum.goType, extra)
		}
	}
}
