package dsp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// adaptersLoop is docs/adapters.md's Go agent loop: assemble, adapt, call the
// model, report the usage, twice.
func adaptersLoop(ctx context.Context, address, modelServer string) {
	client, err := dsp.Connect(ctx, address)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	client.Section(ctx, "rules", 10, "You review patches. Be brief.")
	client.Context(ctx, "cwd", 10, "Working directory: /work.")
	client.Tools(ctx, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{
		Name: "bash", Description: "Run a shell command.",
		ParametersJSON: `{"type":"object","properties":{"command":{"type":"string"}}}`,
	}}})
	messages := []any{map[string]any{"role": "user", "content": "Review the patch."}}
	for turn := 1; turn <= 2; turn++ {
		rendered, err := client.Render(ctx, dsp.WithReportKey("conv-7"), dsp.WithReport(new(dsp.AssemblyReport)))
		if err != nil {
			log.Fatal(err)
		}
		request, err := dsp.AnthropicMessages(rendered, messages, dsp.AdapterOptions{ReportKey: "conv-7"})
		if err != nil {
			log.Fatal(err)
		}
		request.Body["model"], request.Body["max_tokens"] = "claude", 1024
		body, _ := request.JSON()
		response, err := http.Post(modelServer+"/v1/messages", "application/json", bytes.NewReader(body))
		if err != nil {
			log.Fatal(err)
		}
		var reply struct {
			Content []struct{ Text string }
			Usage   json.RawMessage
		}
		json.NewDecoder(response.Body).Decode(&reply)
		response.Body.Close()
		usage, err := dsp.UsageFromJSON(reply.Usage)
		if err != nil {
			log.Fatal(err)
		}
		entry, err := client.ReportUsage(ctx, request.Scope, request.ReportKey, usage)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("turn %d: %d of %d prompt tokens cached, report %d of conv-7\n",
			turn, *entry.ObservedCachedTokens, *entry.ObservedPromptTokens, entry.Sequence)
		messages = append(messages, map[string]any{"role": "assistant", "content": reply.Content[0].Text},
			map[string]any{"role": "user", "content": "And the tests?"})
	}
}

// The loop runs against a sidecar and a stand-in Messages API, and the docs
// print it as it is here.
func TestTheDocumentedAdaptersLoopReportsEachTurnsUsage(t *testing.T) {
	source := string(must[[]byte](t)(os.ReadFile("adapters_loop_test.go")))
	body := regexp.MustCompile(`(?s)\nfunc adaptersLoop\([^)]*\) \{\n(.*?)\n\}\n`).FindStringSubmatch(source)
	doc := string(must[[]byte](t)(os.ReadFile("../../../docs/adapters.md")))
	block := regexp.MustCompile("(?s)<!-- adapters-go-loop -->\n```go\n(.*?)```").FindStringSubmatch(doc)
	if body == nil || block == nil || body[1]+"\n" != block[1] {
		t.Fatal("docs/adapters.md's Go loop is not adaptersLoop's body")
	}

	var sent [][]byte
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent = append(sent, must[[]byte](t)(io.ReadAll(r.Body)))
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Looks fine."}],`+
			`"usage":{"input_tokens":20,"output_tokens":3,"cache_read_input_tokens":64,"cache_creation_input_tokens":36}}`)
	}))
	defer model.Close()
	s := startSidecar(t, nil)
	out := captured(t, func() { adaptersLoop(within(t, 30*time.Second), s.address, model.URL) })
	if out != "turn 1: 64 of 120 prompt tokens cached, report 1 of conv-7\nturn 2: 64 of 120 prompt tokens cached, report 2 of conv-7\n" {
		t.Fatalf("the loop printed %q", out)
	}
	if len(sent) != 2 || !strings.Contains(string(sent[1]), `"input_schema":{"type":"object","properties":{"command":{"type":"string"}}}`) {
		t.Fatalf("the model got %q", sent)
	}
}

// captured is what run printed on standard output.
func captured(t *testing.T, run func()) string {
	t.Helper()
	reader, writer, err := os.Pipe()
	check(t, err)
	saved := os.Stdout
	os.Stdout = writer
	done := make(chan []byte)
	go func() { data, _ := io.ReadAll(reader); done <- data }()
	run()
	os.Stdout = saved
	writer.Close()
	return string(<-done)
}
