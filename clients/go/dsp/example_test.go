package dsp_test

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The example agent (examples/go, built by `make go-test` into $DSP_GO_EXAMPLE)
// registers, prints its prompt, and after a sidecar restart says it has it back.
func TestTheExampleAgentSurvivesASidecarRestart(t *testing.T) {
	binary := os.Getenv("DSP_GO_EXAMPLE")
	if binary == "" {
		t.Fatal("DSP_GO_EXAMPLE is not set: run the tests with `make go-test`")
	}
	s, restart := restartable(t)
	agent := exec.Command(binary)
	agent.Env = append(os.Environ(), "DSP_ADDRESS="+s.address)
	stdout := must[interface{ Read([]byte) (int, error) }](t)(agent.StdoutPipe())
	check(t, agent.Start())
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	lines := make(chan string, 100)
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	expect(t, lines, "registered; Ctrl-C to leave")
	expect(t, lines, "prompt:")
	expect(t, lines, "You are a careful Go agent running deepseek-v4.")
	expect(t, lines, "as an OpenAI chat request: ") // the example uses a provider adapter
	restart()
	expect(t, lines, "sidecar gone, waiting:")
	expect(t, lines, "reconnected; prompt unchanged")
}

// expect reads lines until one starts with prefix, failing after 30 s.
func expect(t *testing.T, lines <-chan string, prefix string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, open := <-lines:
			if !open {
				t.Fatalf("the agent exited before printing %q", prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return
			}
		case <-timeout:
			t.Fatalf("the agent did not print %q", prefix)
		}
	}
}
