// Fewer lines for the common plugin: Register's run of registrations checked once,
// and helpers for the common provider shapes (Text, FieldVariable, Schemas).

package dsp

import (
	"context"
	"fmt"
)

// Registrations is a run of registrations on one layer that keeps the first
// error, as bufio.Writer does: each method registers unless an earlier one
// failed, and Err says how the run went, so that a plugin registers a part per
// line and checks once. What registered before a failure stays registered
// (disposed with its scope or the session, as always); the handles are the
// plain methods' (Section, SectionFunc, ...), for a part that will be updated.
//
//	err := agent.Register(ctx).
//		Section("role", 10, "You review {{language}} code.").
//		VariableFunc("language", dsp.FieldVariable("language")).
//		Err()
type Registrations struct {
	ctx context.Context
	r   *registrar
	err error
}

// Register starts a run of registrations on this layer, each bounded by ctx.
func (r *registrar) Register(ctx context.Context) *Registrations {
	return &Registrations{ctx: ctx, r: r}
}

// Err is the first registration's error of the run, or nil when all were made.
func (g *Registrations) Err() error { return g.err }

// run makes the registration unless the run failed already, and keeps its error.
func (g *Registrations) run(register func() error) *Registrations {
	if g.err == nil {
		g.err = register()
	}
	return g
}

// Section registers a static section (as the registrar's Section) unless the run failed.
func (g *Registrations) Section(name string, order float64, text string, opts ...SectionOption) *Registrations {
	return g.run(func() error { _, err := g.r.Section(g.ctx, name, order, text, opts...); return err })
}

// SectionFunc registers a section provider (as the registrar's SectionFunc) unless the run failed.
func (g *Registrations) SectionFunc(name string, order float64, text TextFunc, opts ...SectionOption) *Registrations {
	return g.run(func() error { _, err := g.r.SectionFunc(g.ctx, name, order, text, opts...); return err })
}

// Context registers a static runtime context unless the run failed.
func (g *Registrations) Context(name string, order float64, text string) *Registrations {
	return g.run(func() error { _, err := g.r.Context(g.ctx, name, order, text); return err })
}

// ContextFunc registers a runtime-context provider unless the run failed.
func (g *Registrations) ContextFunc(name string, order float64, text TextFunc, opts ...ProviderOption) *Registrations {
	return g.run(func() error { _, err := g.r.ContextFunc(g.ctx, name, order, text, opts...); return err })
}

// Variable registers {{name}} with a static value unless the run failed.
func (g *Registrations) Variable(name, value string) *Registrations {
	return g.run(func() error { _, err := g.r.Variable(g.ctx, name, value); return err })
}

// VariableFunc registers a variable provider unless the run failed.
func (g *Registrations) VariableFunc(name string, value VariableFunc, opts ...ProviderOption) *Registrations {
	return g.run(func() error { _, err := g.r.VariableFunc(g.ctx, name, value, opts...); return err })
}

// Tools registers a static tool list unless the run failed.
func (g *Registrations) Tools(tools ToolProviderResult) *Registrations {
	return g.run(func() error { _, err := g.r.Tools(g.ctx, tools); return err })
}

// ToolsFunc registers a tool provider unless the run failed.
func (g *Registrations) ToolsFunc(tools ToolsFunc, opts ...ProviderOption) *Registrations {
	return g.run(func() error { _, err := g.r.ToolsFunc(g.ctx, tools, opts...); return err })
}

// SuppressRuntimeContext suppresses runtime context on this layer unless the run failed.
func (g *Registrations) SuppressRuntimeContext() *Registrations {
	return g.run(func() error { _, err := g.r.SuppressRuntimeContext(g.ctx); return err })
}

// OnAssemble installs a listener unless the run failed; ctx bounds its install alone.
func (g *Registrations) OnAssemble(listener Listener, opts ...ListenerOption) *Registrations {
	return g.run(func() error { _, err := g.r.OnAssemble(g.ctx, listener, opts...); return err })
}

// Rule registers a rule (as the registrar's Rule) unless the run failed.
func (g *Registrations) Rule(name string, rule Rule, opts ...RuleOption) *Registrations {
	return g.run(func() error { _, err := g.r.Rule(g.ctx, name, rule, opts...); return err })
}

// Text is a TextFunc for text that needs only the assembly's context and cannot
// fail (a value computed from the fields, the time, the process's state).
func Text(text func(assembly AssembleContext) string) TextFunc {
	return func(_ context.Context, assembly AssembleContext) (string, error) { return text(assembly), nil }
}

// FieldVariable is a VariableFunc whose value is the assembly's field key (as
// AssembleContext.Text gives it), and no value when the caller did not send it.
func FieldVariable(key string) VariableFunc {
	return func(_ context.Context, assembly AssembleContext) (string, bool, error) {
		value, ok := assembly.Text(key)
		return value, ok, nil
	}
}

// Schemas is the ToolProviderResult of these tools, known by their names.
func Schemas(tools ...ToolSchema) ToolProviderResult { return ToolProviderResult{Schemas: tools} }

// Text returns the field key as text: a string as it is, another JSON value
// as fmt.Sprint prints it (a number 3 as "3"); ok is false when the caller did
// not send it or sent null.
func (c AssembleContext) Text(key string) (value string, ok bool) {
	switch field := c.Fields[key].(type) {
	case nil:
		return "", false
	case string:
		return field, true
	default:
		return fmt.Sprint(field), true
	}
}
