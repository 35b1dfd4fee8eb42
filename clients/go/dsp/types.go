// The client's value types and their messages.

package dsp

import (
	"encoding/json"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// The contract's names (the registry's constants).
const (
	// ToolOrderRest is tool_order's rest entry; no tool may carry this name.
	ToolOrderRest = "<unlisted-tools>"
	// PersonaSection is the built-in section of the configured persona.
	PersonaSection = "deployment:persona"
	// PersonaOrder is the persona section's order.
	PersonaOrder = 0
)

// Assembly is an assembled prompt: what the model is told, before interpolation.
type Assembly struct {
	// Sections in prompt order, text resolved, not yet interpolated.
	Sections []Part
	// Contexts are the runtime contexts in order; none when suppressed.
	Contexts []Part
	// Tools in model order.
	Tools []ToolSchema
	// Variables resolved for this assembly, in the registry's map order.
	Variables []Variable
}

// Part is one named text of an assembly: a section or a runtime context.
type Part struct {
	Name string
	Text string
}

// ToolSchema is one tool definition as the model sees it.
type ToolSchema struct {
	Name        string
	Description string
	// ParametersJSON is the JSON Schema object of the tool's parameters, as JSON
	// text kept byte for byte as given: byte-identical schemas keep a model
	// server's prompt cache warm ("" sends "{}"). json.RawMessage(ParametersJSON)
	// embeds it in a request to a model server.
	ParametersJSON string
}

// ToolProviderResult is what a tool provider answers.
type ToolProviderResult struct {
	// Schemas are the tools visible for this assembly.
	Schemas []ToolSchema
	// KnownNames is the pre-restriction universe that tool_order is checked
	// against; nil means the schemas' names.
	KnownNames []string
}

// Variable is one resolved {{name}} of an assembly.
type Variable struct {
	Name string
	// Value is nil when the variable has no value for this assembly.
	Value *string
}

// AssembleContext is what one assembly is for, as providers and listeners see it.
type AssembleContext struct {
	// Scope is the scope key assembled for; "" for the global layer alone.
	Scope string
	// Fields are the caller's free-form fields (a JSON object, decoded).
	Fields map[string]any
}

// Get returns the field key, or nil when the caller did not send it.
func (c AssembleContext) Get(key string) any { return c.Fields[key] }

// Rendered is an assembly rendered by the sidecar.
type Rendered struct {
	// Prompt is the system prompt: interpolated sections joined by blank lines.
	Prompt string
	// ContextSnapshot is the runtime-context snapshot, or "" when no context is left.
	ContextSnapshot string
	// Assembly is what was rendered.
	Assembly *Assembly
	// Skipped are the steps the assembly went on without (callbacks under
	// FailurePolicyIgnore that failed); nil when it is complete.
	Skipped []SkippedStep
}

// SkippedStep is a step an assembly went on without: a callback under
// FailurePolicyIgnore that failed, did not answer in time, or was gone.
type SkippedStep struct {
	// Kind is a provider's ("section", "context", "tools", "variable") or "listener".
	Kind ChangeKind
	// Name is its name, or the label of a tool provider or listener.
	Name string
	// Scope is the scope whose layer holds it; "" for the global layer.
	Scope string
	// Ref is its public reference, as in change events and listings.
	Ref string
	// Reason is why: ReasonProviderFailed, ReasonProviderTimeout, ReasonListenerFailed, ...
	Reason Reason
	// Message is what the assembly would have failed with under FailurePolicyFail.
	Message string
}

func partsFromProto[M interface {
	GetName() string
	GetText() string
}](messages []M) []Part {
	parts := make([]Part, len(messages))
	for i, m := range messages {
		parts[i] = Part{Name: m.GetName(), Text: m.GetText()}
	}
	return parts
}

func toolFromProto(m *pb.ToolSchema) ToolSchema {
	return ToolSchema{Name: m.GetName(), Description: m.GetDescription(), ParametersJSON: m.GetParametersJson()}
}

func toolsFromProto(messages []*pb.ToolSchema) []ToolSchema {
	tools := make([]ToolSchema, len(messages))
	for i, m := range messages {
		tools[i] = toolFromProto(m)
	}
	return tools
}

func toolToProto(t ToolSchema) *pb.ToolSchema {
	parameters := t.ParametersJSON
	if parameters == "" {
		parameters = "{}" // the contract requires JSON; no parameters is the empty object
	}
	return &pb.ToolSchema{Name: t.Name, Description: t.Description, ParametersJson: parameters}
}

func toolsToProto(tools []ToolSchema) []*pb.ToolSchema {
	messages := make([]*pb.ToolSchema, len(tools))
	for i, t := range tools {
		messages[i] = toolToProto(t)
	}
	return messages
}

func resultToProto(r ToolProviderResult) *pb.ToolProviderResult {
	m := &pb.ToolProviderResult{Schemas: toolsToProto(r.Schemas)}
	if r.KnownNames != nil {
		m.KnownNames = &pb.KnownNames{Names: r.KnownNames}
	}
	return m
}

func assemblyToProto(a *Assembly) *pb.PromptAssembly {
	m := &pb.PromptAssembly{Tools: toolsToProto(a.Tools)}
	for _, s := range a.Sections {
		m.Sections = append(m.Sections, &pb.AssembledSection{Name: s.Name, Text: s.Text})
	}
	for _, c := range a.Contexts {
		m.Contexts = append(m.Contexts, &pb.AssembledContext{Name: c.Name, Text: c.Text})
	}
	for _, v := range a.Variables {
		m.Variables = append(m.Variables, &pb.Variable{Name: v.Name, Value: v.Value})
	}
	return m
}

// contextFromProto decodes the assemble context; fields that are not a JSON object fail.
func contextFromProto(m *pb.AssembleContext) (AssembleContext, error) {
	c := AssembleContext{Scope: m.GetScope(), Fields: map[string]any{}}
	if m.GetFieldsJson() == "" {
		return c, nil
	}
	if err := json.Unmarshal([]byte(m.GetFieldsJson()), &c.Fields); err != nil {
		return c, invalid("the assemble context's fields are not a JSON object: %v", err)
	}
	if c.Fields == nil {
		c.Fields = map[string]any{} // the JSON was null
	}
	return c, nil
}

// Clone returns a deep copy, so that a listener may change it without touching the original.
func (a *Assembly) Clone() *Assembly {
	c := &Assembly{
		Sections:  append([]Part(nil), a.Sections...),
		Contexts:  append([]Part(nil), a.Contexts...),
		Tools:     append([]ToolSchema(nil), a.Tools...),
		Variables: append([]Variable(nil), a.Variables...),
	}
	return c
}
