package dsp_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// Examples of the callback cache, the local cache and a named tool provider, run
// by `go test` against the examples' sidecar.

// A provider made WithCache is asked once per registry revision; Invalidate
// makes the next assembly ask it again.
func ExampleWithCache() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	asked := 0
	summary := func(context.Context, dsp.AssembleContext) (string, error) {
		asked++ // a costly summary of the repository
		return fmt.Sprintf("Repository summary #%d.", asked), nil
	}
	agent, err := client.Scope(ctx, "example-cached")
	if err != nil {
		log.Fatal(err)
	}
	repo, err := agent.SectionFunc(ctx, "repo", 10, summary, dsp.WithCache(dsp.CacheRevision))
	if err != nil {
		log.Fatal(err)
	}
	show := func() {
		assembly, err := client.Assemble(ctx, dsp.ForScope("example-cached"))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(assembly.Sections[len(assembly.Sections)-1].Text)
	}
	show()
	show() // the same revision: the sidecar reuses the answer
	// The repository changed:
	if err := repo.Invalidate(ctx); err != nil {
		log.Fatal(err)
	}
	show()
	// Output:
	// Repository summary #1.
	// Repository summary #1.
	// Repository summary #2.
}

// With WithLocalCache a repeated Assemble of a static scope is answered in this
// process; the client's own update is seen by its next Assemble.
func ExampleWithLocalCache() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress(), dsp.WithLocalCache())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	agent, err := client.Scope(ctx, "example-local")
	if err != nil {
		log.Fatal(err)
	}
	rules, err := agent.Section(ctx, "rules", 10, "Be brief.")
	if err != nil {
		log.Fatal(err)
	}
	for _, update := range []string{"", "Be thorough."} {
		if update != "" {
			if _, err := rules.Update(ctx, update); err != nil {
				log.Fatal(err)
			}
		}
		for i := 0; i < 2; i++ { // the second is a copy of the first, without a call
			assembly, err := client.Assemble(ctx, dsp.ForScope("example-local"))
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(assembly.Sections[len(assembly.Sections)-1].Text)
		}
	}
	// Output:
	// Be brief.
	// Be brief.
	// Be thorough.
	// Be thorough.
}

// ToolsName labels a tool provider in errors and change events.
func ExampleToolsName() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := dsp.Connect(ctx, sidecarAddress())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	agent, err := client.Scope(ctx, "example-named-tools")
	if err != nil {
		log.Fatal(err)
	}
	repoTools := func(context.Context, dsp.AssembleContext) (dsp.ToolProviderResult, error) {
		return dsp.ToolProviderResult{}, errors.New("not a repository")
	}
	if _, err := agent.ToolsFunc(ctx, repoTools, dsp.ToolsName("repo-tools")); err != nil {
		log.Fatal(err)
	}
	_, err = client.Assemble(ctx, dsp.ForScope("example-named-tools"))
	var failure *dsp.Error
	if errors.As(err, &failure) {
		fmt.Println(failure.Reason)
		fmt.Println(failure.Message)
	}
	// Output:
	// PROVIDER_FAILED
	// tools provider "repo-tools" in scope "example-named-tools" failed: not a repository
}
