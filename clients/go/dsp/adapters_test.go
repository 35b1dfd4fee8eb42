package dsp_test

import (
	"strings"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// The Go client's provider adapters against expected bytes: no Go SDK is
// reachable here, so the body each returns is checked as the JSON a model
// server would get, from a real sidecar's assembly.

// bashSchema has keys in no sorted order, non-ASCII text and markup that
// json.Marshal would escape: the sidecar's bytes must reach the body as they are.
const bashSchema = `{"type":"object","properties":{"command":{"type":"string","description":"À exécuter <tel quel>"},"timeout":{"type":"integer","minimum":1,"default":30}},"required":["command"]}`

const snapshot = "Current runtime context. This snapshot supersedes earlier runtime-context snapshots.\n\nWorking directory: /work."

func adapted(t *testing.T) (*dsp.Client, *dsp.Rendered) {
	// tool_order puts bash first: neither the registration nor the sorted order.
	s := startSidecar(t, []string{`include_harness_identity = false`, `tool_order = ["bash", "<unlisted-tools>"]`})
	client := connect(t, s)
	must[*dsp.VariableHandle](t)(client.Variable(bg, "model", "deepseek-v4"))
	must[*dsp.Handle[string]](t)(client.Section(bg, "rules", 10, "You are a careful reviewer on {{model}}."))
	must[*dsp.Handle[string]](t)(client.Context(bg, "cwd", 10, "Working directory: /work."))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.Tools(bg, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{
		{Name: "apply_patch", Description: "Apply a patch.", ParametersJSON: `{"type":"object"}`},
		{Name: "bash", Description: "Run a shell command.", ParametersJSON: bashSchema},
		{Name: "clock", Description: "Tell the time.", ParametersJSON: `{}`},
	}}))
	var report dsp.AssemblyReport
	rendered := must[*dsp.Rendered](t)(client.Render(bg, dsp.WithReport(&report), dsp.WithReportKey("conv-7")))
	return client, rendered
}

func body(t *testing.T, request *dsp.ProviderRequest) string {
	t.Helper()
	return string(must[[]byte](t)(request.JSON()))
}

func sameJSON(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s:\n got: %s\nwant: %s", what, got, want)
	}
}

var history = []any{map[string]any{"role": "user", "content": "Review the patch."}}

func TestOpenAIChatKeepsTheToolOrderAndTheSchemaBytes(t *testing.T) {
	client, rendered := adapted(t)
	request := must[*dsp.ProviderRequest](t)(dsp.OpenAIChat(rendered, history, dsp.AdapterOptions{ReportKey: "conv-7"}))
	sameJSON(t, "chat", body(t, request), `{"messages":[`+
		`{"content":"You are a careful reviewer on deepseek-v4.","role":"system"},`+
		`{"content":"Review the patch.","role":"user"},`+
		`{"content":"Current runtime context. This snapshot supersedes earlier runtime-context snapshots.\n\nWorking directory: /work.","role":"user"}],`+
		`"tools":[`+
		`{"function":{"description":"Run a shell command.","name":"bash","parameters":`+bashSchema+`,"strict":false},"type":"function"},`+
		`{"function":{"description":"Apply a patch.","name":"apply_patch","parameters":{"type":"object"},"strict":false},"type":"function"},`+
		`{"function":{"description":"Tell the time.","name":"clock","parameters":{"type":"object"},"strict":false},"type":"function"}]}`)

	// the usage that comes back goes to the report the assembly was rendered under
	usage := must[dsp.Usage](t)(dsp.UsageFromJSON([]byte(`{"prompt_tokens":120,"prompt_tokens_details":{"cached_tokens":64}}`)))
	entry := must[*dsp.CacheHistoryEntry](t)(client.ReportUsage(bg, request.Scope, request.ReportKey, usage))
	if entry.ObservedCachedTokens == nil || *entry.ObservedCachedTokens != 64 {
		t.Fatalf("the reported entry: %+v", entry)
	}

	strict := must[*dsp.ProviderRequest](t)(dsp.OpenAIChat(rendered, nil, dsp.AdapterOptions{Strict: true, SystemRole: "developer"}))
	text := body(t, strict)
	if !strings.HasPrefix(text, `{"messages":[{"content":"You are a careful reviewer on deepseek-v4.","role":"developer"},{"content":"Current`) ||
		strings.Count(text, `"strict":true`) != 3 {
		t.Fatalf("strict, as a developer message: %s", text)
	}
}

func TestOpenAIResponsesSendsInstructionsAndFlatTools(t *testing.T) {
	_, rendered := adapted(t)
	request := must[*dsp.ProviderRequest](t)(dsp.OpenAIResponses(rendered, history, dsp.AdapterOptions{}))
	sameJSON(t, "responses", body(t, request), `{"input":[`+
		`{"content":"Review the patch.","role":"user"},`+
		`{"content":"`+strings.ReplaceAll(snapshot, "\n", `\n`)+`","role":"user"}],`+
		`"instructions":"You are a careful reviewer on deepseek-v4.",`+
		`"tools":[`+
		`{"description":"Run a shell command.","name":"bash","parameters":`+bashSchema+`,"strict":false,"type":"function"},`+
		`{"description":"Apply a patch.","name":"apply_patch","parameters":{"type":"object"},"strict":false,"type":"function"},`+
		`{"description":"Tell the time.","name":"clock","parameters":{"type":"object"},"strict":false,"type":"function"}]}`)
}

func TestAnthropicMessagesPutsTheBreakpointsBeforeTheSnapshot(t *testing.T) {
	client, rendered := adapted(t)
	request := must[*dsp.ProviderRequest](t)(dsp.AnthropicMessages(rendered, history, dsp.AdapterOptions{ReportKey: "conv-7"}))
	sameJSON(t, "anthropic", body(t, request), `{"messages":[`+
		`{"content":"Review the patch.","role":"user"},`+
		`{"content":[{"text":"`+strings.ReplaceAll(snapshot, "\n", `\n`)+`","type":"text"}],"role":"user"}],`+
		`"system":[{"cache_control":{"type":"ephemeral"},"text":"You are a careful reviewer on deepseek-v4.","type":"text"}],`+
		`"tools":[`+
		`{"description":"Run a shell command.","input_schema":`+bashSchema+`,"name":"bash"},`+
		`{"description":"Apply a patch.","input_schema":{"type":"object"},"name":"apply_patch"},`+
		`{"cache_control":{"type":"ephemeral"},"description":"Tell the time.","input_schema":{"type":"object"},"name":"clock"}]}`)
	usage := must[dsp.Usage](t)(dsp.UsageFromJSON([]byte(`{"input_tokens":20,"cache_read_input_tokens":64,"cache_creation_input_tokens":36}`)))
	entry := must[*dsp.CacheHistoryEntry](t)(client.ReportUsage(bg, request.Scope, request.ReportKey, usage))
	if *entry.ObservedCachedTokens != 64 || *entry.ObservedPromptTokens != 120 {
		t.Fatalf("the reported entry: %+v", entry)
	}

	ttl := body(t, must[*dsp.ProviderRequest](t)(dsp.AnthropicMessages(rendered, nil, dsp.AdapterOptions{CacheTTL: "1h", Strict: true})))
	if strings.Count(ttl, `"cache_control":{"ttl":"1h","type":"ephemeral"}`) != 2 || strings.Count(ttl, `"strict":true`) != 3 {
		t.Fatalf("with a TTL, strict: %s", ttl)
	}
	bare := body(t, must[*dsp.ProviderRequest](t)(dsp.AnthropicMessages(rendered, nil, dsp.AdapterOptions{NoCache: true})))
	if strings.Contains(bare, "cache_control") || strings.Contains(bare, "strict") {
		t.Fatalf("without breakpoints: %s", bare)
	}
}

func TestGeminiSendsTheSystemInstructionAndJSONSchemas(t *testing.T) {
	client, rendered := adapted(t)
	contents := []any{map[string]any{"role": "user", "parts": []any{map[string]any{"text": "Review the patch."}}}}
	request := must[*dsp.ProviderRequest](t)(dsp.Gemini(rendered, contents, dsp.AdapterOptions{ReportKey: "conv-7"}))
	sameJSON(t, "gemini", body(t, request), `{"contents":[`+
		`{"parts":[{"text":"Review the patch."}],"role":"user"},`+
		`{"parts":[{"text":"`+strings.ReplaceAll(snapshot, "\n", `\n`)+`"}],"role":"user"}],`+
		`"systemInstruction":{"parts":[{"text":"You are a careful reviewer on deepseek-v4."}]},`+
		`"tools":[{"functionDeclarations":[`+
		`{"description":"Run a shell command.","name":"bash","parametersJsonSchema":`+bashSchema+`},`+
		`{"description":"Apply a patch.","name":"apply_patch","parametersJsonSchema":{"type":"object"}},`+
		`{"description":"Tell the time.","name":"clock","parametersJsonSchema":{"type":"object"}}]}]}`)
	usage := must[dsp.Usage](t)(dsp.UsageFromJSON([]byte(`{"promptTokenCount":120,"cachedContentTokenCount":64,"totalTokenCount":122}`)))
	entry := must[*dsp.CacheHistoryEntry](t)(client.ReportUsage(bg, request.Scope, request.ReportKey, usage))
	if *entry.ObservedCachedTokens != 64 || *entry.ObservedPromptTokens != 120 {
		t.Fatalf("the reported entry: %+v", entry)
	}
	none := must[dsp.Usage](t)(dsp.UsageFromJSON([]byte(`{"promptTokenCount":9}`)))
	if none.CachedTokens != 0 || none.PromptTokens == nil || *none.PromptTokens != 9 {
		t.Fatalf("nothing cached: %+v", none)
	}
}

func TestASchemaThatIsNotAnObjectIsRefused(t *testing.T) {
	_, err := dsp.ToolParameters(dsp.ToolSchema{Name: "odd", ParametersJSON: "[1]"})
	if failure(t, err).Message != `tool "odd" parameters are not a JSON object` {
		t.Fatalf("refused with: %v", err)
	}
	if raw, err := dsp.ToolParameters(dsp.ToolSchema{Name: "none"}); err != nil || string(raw) != `{"type":"object"}` {
		t.Fatalf("no parameters: %s %v", raw, err)
	}
}
