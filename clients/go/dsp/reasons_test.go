package dsp_test

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"sort"
	"strconv"
	"strings"
	"testing"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// The Reason constants are typed by hand in errors.go: they must be the
// proto's ErrorReason enum (as generated into gen/), each named for its value.

// reasonConstants reads errors.go's constants of type Reason: name to value.
func reasonConstants(t *testing.T) map[string]string {
	t.Helper()
	file, err := parser.ParseFile(gotoken.NewFileSet(), "errors.go", nil, 0)
	check(t, err)
	constants := map[string]string{}
	for _, decl := range file.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != gotoken.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			value := spec.(*ast.ValueSpec)
			if typ, ok := value.Type.(*ast.Ident); !ok || typ.Name != "Reason" {
				continue
			}
			for i, name := range value.Names {
				text, err := strconv.Unquote(value.Values[i].(*ast.BasicLit).Value)
				check(t, err)
				constants[name.Name] = text
			}
		}
	}
	return constants
}

func TestTheReasonConstantsAreTheProtosErrorReasonEnum(t *testing.T) {
	constants := reasonConstants(t)
	typed := map[string]bool{}
	for name, value := range constants {
		if _, ok := pb.ErrorReason_value[value]; !ok || value == pb.ErrorReason_ERROR_REASON_UNSPECIFIED.String() {
			t.Errorf("%s = %q is not a value of the proto's ErrorReason", name, value)
		}
		// ReasonInvalidJSON for INVALID_JSON: the same letters, the underscores dropped.
		if strings.ToUpper(strings.TrimPrefix(name, "Reason")) != strings.ReplaceAll(value, "_", "") {
			t.Errorf("%s is not named for its value %q", name, value)
		}
		typed[value] = true
	}
	missing := []string{}
	for value := range pb.ErrorReason_value {
		if !typed[value] && value != pb.ErrorReason_ERROR_REASON_UNSPECIFIED.String() {
			missing = append(missing, value)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the proto's ErrorReason values without a Reason constant: %v", missing)
	}
	if len(constants) != len(pb.ErrorReason_value)-1 {
		t.Errorf("%d Reason constants for %d ErrorReason values (besides UNSPECIFIED)", len(constants), len(pb.ErrorReason_value)-1)
	}
}
