// ToolsName: the label of a tools provider in errors, reports and change events.

package dsp

// ToolsName names a ToolsFunc's provider in errors, reports, skipped steps and
// change events (default: the function's name, which for a closure is the
// compiler's, e.g. "main.main.func1"). ContextFunc and VariableFunc refuse it
// (INVALID_VALUE): they are named by their name.
func ToolsName(name string) ProviderOption { return toolsName(name) }

type toolsName string

func (n toolsName) applyProvider(a *asked) { a.name = label(string(n)) }
