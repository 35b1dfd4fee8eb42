// A Go agent on the dsh-system-prompt sidecar: it registers its parts, prints
// the prompt the sidecar renders for it, and keeps them through a sidecar
// restart (the client reconnects and replays them). Ctrl-C to leave.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	client := must(dsp.Connect(ctx, "", dsp.WithWaitForReady(0))) // $DSP_ADDRESS
	defer client.Close()
	agent := must(client.Scope(ctx, "go-agent"))
	must(agent.Section(ctx, "role", 10, "You are a careful Go agent running {{model}}."))
	must(agent.SectionFunc(ctx, "cwd", 20, func(context.Context, dsp.AssembleContext) (string, error) {
		dir, err := os.Getwd()
		return "Working directory: " + dir, err
	}))
	must(agent.Variable(ctx, "model", "deepseek-v4"))
	must(agent.Tools(ctx, dsp.ToolProviderResult{Schemas: []dsp.ToolSchema{{
		Name: "read_file", Description: "Read a file.",
		ParametersJSON: `{"type":"object","properties":{"path":{"type":"string"}}}`,
	}}}))
	fmt.Println("registered; Ctrl-C to leave")
	last, down := "", false
	for ctx.Err() == nil {
		rendered, err := client.Render(ctx, dsp.ForScope("go-agent"))
		switch {
		case err != nil && !down:
			fmt.Println("sidecar gone, waiting:", err)
		case err == nil && rendered.Prompt != last:
			fmt.Printf("prompt:\n%s\n", rendered.Prompt)
			fmt.Printf("as an OpenAI chat request: %d bytes\n", len(must(must(dsp.OpenAIChat(rendered, nil, dsp.AdapterOptions{})).JSON())))
		case err == nil && down:
			fmt.Println("reconnected; prompt unchanged")
		}
		if err == nil {
			last = rendered.Prompt
		}
		down = err != nil
		time.Sleep(250 * time.Millisecond)
	}
}

func must[T any](value T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return value
}
