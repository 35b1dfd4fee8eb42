// Provider adapters: a rendered assembly as the JSON body of one model call.

package dsp

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// AdapterOptions tune a provider adapter; the zero value is the default.
type AdapterOptions struct {
	// Strict sets each tool's "strict" (OpenAI: always sent, false by default;
	// Anthropic: sent only when true).
	Strict bool
	// SystemRole is the role of OpenAIChat's first message: "system" (when "")
	// or "developer".
	SystemRole string
	// NoCache leaves out AnthropicMessages' cache_control breakpoints.
	NoCache bool
	// CacheTTL is the breakpoints' "ttl" ("5m" or "1h"); "" sends none.
	CacheTTL string
	// Scope and ReportKey are where the usage of the call is to be reported
	// (the scope and key the assembly was rendered with): they come back on
	// the ProviderRequest, for ReportUsage.
	Scope, ReportKey string
}

// ProviderRequest is one model call: Body is the request's JSON body (the
// model and, for Anthropic, max_tokens are the caller's to add), and Scope
// and ReportKey are where its usage goes:
//
//	usage, _ := dsp.UsageFromJSON(responseUsage)
//	client.ReportUsage(ctx, req.Scope, req.ReportKey, usage)
//
// Each tool's parameters are the sidecar's JSON text as a json.RawMessage, so
// their bytes reach the wire as the sidecar sent them; marshal Body with
// JSON (json.Marshal would escape <, > and & inside them).
type ProviderRequest struct {
	Body             map[string]any
	Scope, ReportKey string
}

// JSON is Body as JSON without HTML escaping: the tools' schemas byte for byte.
func (r *ProviderRequest) JSON() ([]byte, error) {
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(r.Body); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}

// ToolParameters is a tool's JSON Schema as sent: its own text, or
// {"type":"object"} for an empty one (each provider here wants an object schema).
func ToolParameters(tool ToolSchema) (json.RawMessage, error) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(tool.ParametersJSON)); err != nil && tool.ParametersJSON != "" {
		return nil, invalid("tool %q: parameters are not JSON", tool.Name)
	}
	switch text := compact.String(); {
	case text == "" || text == "{}":
		return json.RawMessage(`{"type":"object"}`), nil
	case text[0] != '{':
		return nil, invalid("tool %q parameters are not a JSON object", tool.Name)
	}
	return json.RawMessage(tool.ParametersJSON), nil
}

// OpenAIChat is the body of an OpenAI Chat Completions call: the prompt as the
// first message, then messages, then the runtime-context snapshot as a user
// message; tools as {"type":"function","function":{...}} in the assembly's order.
func OpenAIChat(r *Rendered, messages []any, opts AdapterOptions) (*ProviderRequest, error) {
	role := opts.SystemRole
	if role == "" {
		role = "system"
	}
	sent := []any{}
	if r.Prompt != "" {
		sent = append(sent, map[string]any{"role": role, "content": r.Prompt})
	}
	sent = append(append(sent, messages...), snapshotMessage(r.ContextSnapshot)...)
	body := map[string]any{"messages": sent}
	tools, err := eachTool(r, func(tool ToolSchema, parameters json.RawMessage) map[string]any {
		return map[string]any{"type": "function", "function": map[string]any{
			"name": tool.Name, "description": tool.Description, "parameters": parameters, "strict": opts.Strict,
		}}
	})
	return request(body, "tools", tools, opts, err)
}

// OpenAIResponses is the body of an OpenAI Responses call: the prompt as
// "instructions", input then the snapshot as a user message; tools as
// {"type":"function","name",...,"parameters","strict"}.
func OpenAIResponses(r *Rendered, input []any, opts AdapterOptions) (*ProviderRequest, error) {
	body := map[string]any{"input": append(append([]any{}, input...), snapshotMessage(r.ContextSnapshot)...)}
	if r.Prompt != "" {
		body["instructions"] = r.Prompt
	}
	tools, err := eachTool(r, func(tool ToolSchema, parameters json.RawMessage) map[string]any {
		return map[string]any{
			"type": "function", "name": tool.Name, "description": tool.Description,
			"parameters": parameters, "strict": opts.Strict,
		}
	})
	return request(body, "tools", tools, opts, err)
}

// AnthropicMessages is the body of an Anthropic Messages call: the prompt as one
// system text block, tools with "input_schema"; unless NoCache, the last tool
// and the system block carry cache_control (the API reads tools, system, then
// messages), and the snapshot, a user message after messages, comes after both.
func AnthropicMessages(r *Rendered, messages []any, opts AdapterOptions) (*ProviderRequest, error) {
	control := map[string]any{"type": "ephemeral"}
	if opts.CacheTTL != "" {
		control["ttl"] = opts.CacheTTL
	}
	var snapshot []any
	if r.ContextSnapshot != "" {
		snapshot = []any{map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": r.ContextSnapshot},
		}}}
	}
	body := map[string]any{"messages": append(append([]any{}, messages...), snapshot...)}
	if r.Prompt != "" {
		block := map[string]any{"type": "text", "text": r.Prompt}
		if !opts.NoCache {
			block["cache_control"] = control
		}
		body["system"] = []any{block}
	}
	tools, err := eachTool(r, func(tool ToolSchema, parameters json.RawMessage) map[string]any {
		entry := map[string]any{"name": tool.Name, "description": tool.Description, "input_schema": parameters}
		if opts.Strict {
			entry["strict"] = true
		}
		return entry
	})
	if len(tools) > 0 && !opts.NoCache {
		tools[len(tools)-1].(map[string]any)["cache_control"] = control
	}
	return request(body, "tools", tools, opts, err)
}

// Gemini is the body of a Gemini generateContent call (the REST API's names):
// the prompt as systemInstruction, tools as one functionDeclarations list whose
// schemas are parametersJsonSchema, contents then the snapshot as a user content.
func Gemini(r *Rendered, contents []any, opts AdapterOptions) (*ProviderRequest, error) {
	sent := append([]any{}, contents...)
	if r.ContextSnapshot != "" {
		sent = append(sent, map[string]any{"role": "user", "parts": []any{map[string]any{"text": r.ContextSnapshot}}})
	}
	body := map[string]any{"contents": sent}
	if r.Prompt != "" {
		body["systemInstruction"] = map[string]any{"parts": []any{map[string]any{"text": r.Prompt}}}
	}
	declarations, err := eachTool(r, func(tool ToolSchema, parameters json.RawMessage) map[string]any {
		return map[string]any{"name": tool.Name, "description": tool.Description, "parametersJsonSchema": parameters}
	})
	var tools []any
	if len(declarations) > 0 {
		tools = []any{map[string]any{"functionDeclarations": declarations}}
	}
	return request(body, "tools", tools, opts, err)
}

func snapshotMessage(text string) []any {
	if text == "" {
		return nil
	}
	return []any{map[string]any{"role": "user", "content": text}}
}

// eachTool makes each assembled tool's entry, in the assembly's order.
func eachTool(r *Rendered, entry func(ToolSchema, json.RawMessage) map[string]any) ([]any, error) {
	if r.Assembly == nil {
		return nil, nil
	}
	tools := make([]any, 0, len(r.Assembly.Tools))
	for _, tool := range r.Assembly.Tools {
		parameters, err := ToolParameters(tool)
		if err != nil {
			return nil, err
		}
		tools = append(tools, entry(tool, parameters))
	}
	return tools, nil
}

// request sets body[key] to tools when there are any (the APIs refuse an empty list).
func request(body map[string]any, key string, tools []any, opts AdapterOptions, err error) (*ProviderRequest, error) {
	if err != nil {
		return nil, fmt.Errorf("adapting the assembly: %w", err)
	}
	if len(tools) > 0 {
		body[key] = tools
	}
	return &ProviderRequest{Body: body, Scope: opts.Scope, ReportKey: opts.ReportKey}, nil
}
