package dsp_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// The package's examples, as godoc shows them, run by `go test` against a real
// sidecar (the shared one of these tests; a program passes its own address, or
// "" for $DSP_ADDRESS, else 127.0.0.1:50051).

// sidecarAddress is the address of a sidecar started for the examples with
// config (TOML lines), shared with the tests of the same config.
func sidecarAddress(config ...string) string {
	key := strings.Join(config, "\n")
	if theShared[key] == nil {
		folder, err := os.MkdirTemp("", "dsp-go-example-")
		if err != nil {
			log.Fatal(err)
		}
		s, err := launch(folder, "127.0.0.1:0", config, nil)
		if err != nil {
			log.Fatal(err)
		}
		theShared[key] = s
	}
	return theShared[key].address
}

// An agent registers its parts and asks the sidecar for its prompt.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close() // disposes everything this session registered
	agent, err := client.Scope(ctx, "example-agent")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Section(ctx, "role", 10, "You review {{language}} code."); err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Variable(ctx, "language", "Go"); err != nil {
		log.Fatal(err)
	}
	task := func(ctx context.Context, a dsp.AssembleContext) (string, error) {
		return fmt.Sprint("Task: ", a.Get("task")), nil // asked at every assembly
	}
	if _, err := agent.SectionFunc(ctx, "task", 20, task); err != nil {
		log.Fatal(err)
	}
	rendered, err := client.Render(ctx, dsp.ForScope("example-agent"),
		dsp.WithFields(map[string]any{"task": "fix the failing test"}))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rendered.Prompt)
	// Output:
	// You are an AI agent powered by DeepSeek Harness.
	//
	// You review Go code.
	//
	// Task: fix the failing test
}

// Assemble returns the parts before interpolation; RenderPrompt renders them
// locally, by the sidecar's rules.
func ExampleClient_Assemble() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	agent, err := client.Scope(ctx, "example-assemble")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Section(ctx, "rules", 10, "Be precise about {{what}}."); err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Variable(ctx, "what", "errors"); err != nil {
		log.Fatal(err)
	}
	assembly, err := client.Assemble(ctx, dsp.ForScope("example-assemble"))
	if err != nil {
		log.Fatal(err)
	}
	for _, section := range assembly.Sections { // the built-ins first
		fmt.Printf("%s: %q\n", section.Name, section.Text)
	}
	prompt, err := dsp.RenderPrompt(assembly) // the persona is empty here: dropped
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.Contains(prompt, "Be precise about errors."))
	// Output:
	// harness:identity: "You are an AI agent powered by DeepSeek Harness."
	// deployment:persona: ""
	// rules: "Be precise about {{what}}."
	// true
}

// A scope sees its ancestors' layers, the nearest shadowing the farthest.
func ExampleClient_Scope() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	team, err := client.Scope(ctx, "example-team")
	if err != nil {
		log.Fatal(err)
	}
	agent, err := client.Scope(ctx, "example-member", dsp.WithParent("example-team"))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := team.Section(ctx, "style", 10, "Write short commits."); err != nil {
		log.Fatal(err)
	}
	if _, err := team.Section(ctx, "tone", 20, "Be formal."); err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Section(ctx, "tone", 20, "Be friendly."); err != nil { // shadows the team's
		log.Fatal(err)
	}
	rendered, err := client.Render(ctx, dsp.ForScope("example-member"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rendered.Prompt)
	// Output:
	// You are an AI agent powered by DeepSeek Harness.
	//
	// Write short commits.
	//
	// Be friendly.
}

// A listener changes the assembly on its way through the waterfall.
func ExampleClient_OnAssemble() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	agent, err := client.Scope(ctx, "example-listened")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Section(ctx, "rules", 10, "Be precise."); err != nil {
		log.Fatal(err)
	}
	sign := func(ctx context.Context, a *dsp.Assembly, c dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "signature", Text: "Signed by " + c.Scope + "."})
		return next.Tail(a) // the rest of the chain's result is this listener's
	}
	if _, err := agent.OnAssemble(ctx, sign, dsp.ListenerName("sign")); err != nil {
		log.Fatal(err)
	}
	rendered, err := client.Render(ctx, dsp.ForScope("example-listened"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rendered.Prompt)
	// Output:
	// You are an AI agent powered by DeepSeek Harness.
	//
	// Be precise.
	//
	// Signed by example-listened.
}

// A static registration's handle changes its value in place: one UPDATED event.
func ExampleHandle_Update() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	changes, err := client.WatchChanges(ctx, dsp.InScope("example-updated", false))
	if err != nil {
		log.Fatal(err)
	}
	defer changes.Close()
	agent, err := client.Scope(ctx, "example-updated")
	if err != nil {
		log.Fatal(err)
	}
	rules, err := agent.Section(ctx, "rules", 10, "Be precise.")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := rules.Update(ctx, "Be exact."); err != nil {
		log.Fatal(err)
	}
	for seen := 0; seen < 2; { // the scope's own event comes first
		change, err := changes.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if event, ok := change.(dsp.ChangeEvent); ok && event.Kind == dsp.ChangeKindSection {
			fmt.Println(event.Action, event.Name)
			seen++
		}
	}
	// Output:
	// registered rules
	// updated rules
}

// The sidecar's refusals are *dsp.Error, with the proto's reason; a call its
// ctx ended is also errors.Is(err, context.Canceled or DeadlineExceeded).
func ExampleError() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	agent, err := client.Scope(ctx, "example-refused")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := agent.Section(ctx, "rules", 10, "Be precise."); err != nil {
		log.Fatal(err)
	}
	_, err = agent.Section(ctx, "rules", 20, "Again.")
	var failure *dsp.Error
	if errors.As(err, &failure) {
		fmt.Println(failure.Code, failure.Reason)
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	_, err = client.Assemble(cancelled, dsp.ForScope("example-refused"))
	fmt.Println(errors.Is(err, context.Canceled))
	// Output:
	// AlreadyExists DUPLICATE_NAME
	// true
}

// With the sidecar's tool_order set, every name it lists must be known to a tool
// provider of the assembly, or the assembly fails UNKNOWN_TOOL_ORDER_NAME. A
// provider that filters its tools says which names it knows (KnownNames), so a
// tool it hides this time is no failure; and KnownNames without schemas, on the
// global layer, keeps the other scopes' assemblies valid once the providers that
// showed the tools are gone.
func ExampleToolProviderResult_knownNames() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	address := sidecarAddress(`tool_order = ["read_file", "<unlisted-tools>", "bash"]`)
	client, err := dsp.Connect(ctx, address)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	readFile := dsp.ToolSchema{Name: "read_file", Description: "Read a file."}
	bash := dsp.ToolSchema{Name: "bash", Description: "Run a command."}
	grep := dsp.ToolSchema{Name: "grep", Description: "Search files."}
	tools := func(ctx context.Context, a dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		shown := []dsp.ToolSchema{bash, grep, readFile}
		if a.Get("readonly") == true {
			shown = []dsp.ToolSchema{grep, readFile}
		}
		return dsp.ToolProviderResult{Schemas: shown, KnownNames: []string{"read_file", "bash", "grep"}}, nil
	}
	agent, err := client.Scope(ctx, "example-tools")
	if err != nil {
		log.Fatal(err)
	}
	if _, err := agent.ToolsFunc(ctx, tools); err != nil {
		log.Fatal(err)
	}
	for _, readonly := range []bool{false, true} {
		assembly, err := client.Assemble(ctx, dsp.ForScope("example-tools"),
			dsp.WithFields(map[string]any{"readonly": readonly}))
		if err != nil {
			log.Fatal(err)
		}
		names := []string{}
		for _, tool := range assembly.Tools {
			names = append(names, tool.Name)
		}
		fmt.Println(strings.Join(names, " "))
	}
	if err := agent.Dispose(ctx); err != nil {
		log.Fatal(err)
	}
	var failure *dsp.Error
	_, err = client.Assemble(ctx, dsp.ForScope("example-other"))
	if errors.As(err, &failure) {
		fmt.Println(failure.Reason)
	}
	if _, err := client.Tools(ctx, dsp.ToolProviderResult{KnownNames: []string{"read_file", "bash"}}); err != nil {
		log.Fatal(err)
	}
	assembly, err := client.Assemble(ctx, dsp.ForScope("example-other"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(assembly.Tools), "tools")
	// Output:
	// read_file grep bash
	// read_file grep
	// UNKNOWN_TOOL_ORDER_NAME
	// 0 tools
}

// RenderPrompt renders an assembly locally: {{variables}} interpolated, empty
// sections dropped, the rest joined by blank lines; a variable without a value
// fails the render, naming it.
func ExampleRenderPrompt() {
	model := "deepseek-v4"
	assembly := &dsp.Assembly{
		Sections: []dsp.Part{
			{Name: "role", Text: "You run on {{model}}."},
			{Name: "empty", Text: ""},
			{Name: "rules", Text: "Be precise."},
		},
		Variables: []dsp.Variable{{Name: "model", Value: &model}, {Name: "user", Value: nil}},
	}
	prompt, err := dsp.RenderPrompt(assembly)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(prompt)
	assembly.Sections = append(assembly.Sections, dsp.Part{Name: "greeting", Text: "Hello {{user}}."})
	_, err = dsp.RenderPrompt(assembly)
	fmt.Println(err)
	// Output:
	// You run on deepseek-v4.
	//
	// Be precise.
	// prompt variable "{{user}}" has no value for this assembly (section "greeting")
}
