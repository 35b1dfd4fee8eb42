package dsp_test

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// The README's table of options names every option the package has (every
// exported function returning one of its option types), each once, and no
// other.

var optionTypes = map[string]bool{
	"Option": true, "ScopeOption": true, "SectionOption": true, "ProviderOption": true, "ListenerOption": true,
	"CallbackOption": true, "AssembleOption": true, "WatchOption": true, "PromptOption": true,
	"RuleOption": true, "StepOption": true,
}

// optionFunctions are the package's exported functions that return an option.
func optionFunctions(t *testing.T) []string {
	t.Helper()
	packages, err := parser.ParseDir(gotoken.NewFileSet(), ".", func(info os.FileInfo) bool {
		return !strings.HasSuffix(info.Name(), "_test.go")
	}, 0)
	check(t, err)
	found := []string{}
	for _, file := range packages["dsp"].Files {
		for _, decl := range file.Decls {
			function, ok := decl.(*ast.FuncDecl)
			if !ok || function.Recv != nil || !function.Name.IsExported() || function.Type.Results == nil {
				continue
			}
			results := function.Type.Results.List
			if result, ok := results[0].Type.(*ast.Ident); ok && len(results) == 1 && optionTypes[result.Name] {
				found = append(found, function.Name.Name)
			}
		}
	}
	sort.Strings(found)
	return found
}

// tabledOptions are the names in the first column of the README's options table.
func tabledOptions(t *testing.T) []string {
	t.Helper()
	readme, err := os.ReadFile("../README.md")
	check(t, err)
	table := regexp.MustCompile("(?s)<!-- go-options -->\n(.*?)\n\n").FindSubmatch(readme)
	if table == nil {
		t.Fatal("the README has no <!-- go-options --> table")
	}
	tabled := []string{}
	for _, row := range strings.Split(string(table[1]), "\n")[2:] {
		first := strings.Split(row, "|")[1]
		for _, name := range regexp.MustCompile("`([A-Za-z]+)`").FindAllStringSubmatch(first, -1) {
			tabled = append(tabled, name[1])
		}
	}
	sort.Strings(tabled)
	return tabled
}

func TestTheReadmesTableNamesEveryOption(t *testing.T) {
	options := optionFunctions(t)
	if len(options) < 25 {
		t.Fatalf("found only %d options: %v", len(options), options)
	}
	equal(t, tabledOptions(t), options)
}
