// Command bench times the Go client's Assemble against an empty unary RPC
// (grpc.health.v1 Health/Check on a channel of its own to the same sidecar),
// interleaved, from one Go process. `python -m bench` runs it (figure
// go_client_assemble, built by `make bench`):
//
//	bench HOST:PORT ITERATIONS WARMUP
//
// It prints one JSON object: each operation's durations in nanoseconds.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc"
	health "google.golang.org/grpc/health/grpc_health_v1"
)

type operation func(context.Context) error

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: bench HOST:PORT ITERATIONS WARMUP")
		os.Exit(2)
	}
	if err := run(os.Args[1], atoi(os.Args[2]), atoi(os.Args[3])); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func atoi(text string) int {
	n, err := strconv.Atoi(text)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	return n
}

func run(address string, iterations, warmup int) error {
	ctx := context.Background()
	client, err := dsp.Connect(ctx, address, dsp.WithClientName("bench-go-client"))
	if err != nil {
		return err
	}
	defer client.Close()
	channel, err := grpc.Dial(address, grpc.WithInsecure())
	if err != nil {
		return err
	}
	defer channel.Close()
	checker := health.NewHealthClient(channel)
	samples, err := interleaved(ctx, []string{"client_assemble", "empty_rpc"}, map[string]operation{
		"client_assemble": func(ctx context.Context) error { _, err := client.Assemble(ctx); return err },
		"empty_rpc": func(ctx context.Context) error {
			_, err := checker.Check(ctx, &health.HealthCheckRequest{})
			return err
		},
	}, iterations, warmup)
	if err != nil {
		return err
	}
	out := map[string]any{"go": runtime.Version()}
	for name, durations := range samples {
		out[name] = durations
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// interleaved times each operation, rotating the order every round so that no
// operation always runs right after the same other one.
func interleaved(ctx context.Context, names []string, operations map[string]operation, rounds, skip int) (map[string][]int64, error) {
	durations := map[string][]int64{}
	for round := 0; round < skip+rounds; round++ {
		shift := round % len(names)
		for i := range names {
			name := names[(i+shift)%len(names)]
			started := time.Now()
			if err := operations[name](ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if round >= skip {
				durations[name] = append(durations[name], time.Since(started).Nanoseconds())
			}
		}
	}
	return durations, nil
}
