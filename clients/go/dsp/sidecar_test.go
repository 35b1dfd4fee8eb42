package dsp_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
)

// A real sidecar for the tests: `dsh-system-prompt serve` from the repository's
// .venv ($DSP_SIDECAR, which `make go-test` sets).

const startTimeout = 30 * time.Second

const identity = "You are an AI agent powered by DeepSeek Harness."

var builtins = map[string]bool{"harness:identity": true, "deployment:persona": true}

type sidecar struct {
	cmd     *exec.Cmd
	address string
	logPath string
	exited  chan struct{}
}

func sidecarCommand() string {
	if path := os.Getenv("DSP_SIDECAR"); path != "" {
		return path
	}
	return "../../../.venv/bin/dsh-system-prompt" // from clients/go/dsp
}

// startSidecar starts a sidecar with config (TOML lines) and flags; it is
// stopped when the test ends.
func startSidecar(t *testing.T, config []string, flags ...string) *sidecar {
	t.Helper()
	s, err := launch(t.TempDir(), "127.0.0.1:0", config, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.stop)
	return s
}

// theShared are the sidecars tests share, by their config.
var theShared = map[string]*sidecar{}

// shared is one sidecar for the tests that need no config of their own
// (started on first use, stopped by TestMain): a start costs a second.
func shared(t *testing.T) *sidecar {
	t.Helper()
	return sharedWith(t, nil)
}

// sharedWith is one sidecar with config for the tests that need the same config
// and leave nothing behind but their own clients' registrations.
func sharedWith(t *testing.T, config []string) *sidecar {
	t.Helper()
	key := strings.Join(config, "\n")
	if theShared[key] == nil {
		folder, err := os.MkdirTemp("", "dsp-go-")
		if err != nil {
			t.Fatal(err)
		}
		s, err := launch(folder, "127.0.0.1:0", config, nil)
		if err != nil {
			t.Fatal(err)
		}
		theShared[key] = s
	}
	return theShared[key]
}

func TestMain(m *testing.M) {
	if helper := os.Getenv(helperVariable); helper != "" {
		os.Exit(runHelper(helper))
	}
	code := m.Run()
	for _, s := range theShared {
		s.stop()
	}
	os.Exit(code)
}

// restartAt starts a sidecar on the address another one just left; another
// process may hold that port for a moment, so it retries then.
func restartAt(t *testing.T, address string, config []string, flags ...string) *sidecar {
	t.Helper()
	for attempt := 1; ; attempt++ {
		s, err := launch(t.TempDir(), address, config, flags)
		if err == nil {
			t.Cleanup(s.stop)
			return s
		}
		if attempt >= 50 || !strings.Contains(err.Error(), "address in use") {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func launch(folder, listen string, config []string, flags []string) (*sidecar, error) {
	args := append([]string{"serve", "--listen", listen}, flags...)
	if len(config) > 0 {
		path := filepath.Join(folder, "sidecar.toml")
		if err := os.WriteFile(path, []byte(strings.Join(config, "\n")+"\n"), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--config", path)
	}
	logPath := filepath.Join(folder, "stderr.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(sidecarCommand(), args...)
	cmd.Stderr = logFile // a file: a chatty sidecar never blocks on a full pipe
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start the sidecar (make .venv/.installed): %w", err)
	}
	s := &sidecar{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	found := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if at := strings.Index(lines.Text(), "listening on "); at >= 0 {
				found <- strings.TrimSpace(lines.Text()[at+len("listening on "):])
			}
		}
		cmd.Wait()
		close(s.exited)
	}()
	select {
	case s.address = <-found:
	case <-s.exited:
		return nil, fmt.Errorf("the sidecar exited: %s", s.log())
	case <-time.After(startTimeout):
		s.kill()
		return nil, fmt.Errorf("the sidecar did not start: %s", s.log())
	}
	return s, nil
}

func (s *sidecar) log() string {
	text, _ := os.ReadFile(s.logPath)
	return string(text)
}

// stop sends SIGTERM and waits for the exit.
func (s *sidecar) stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		s.kill()
	}
}

func (s *sidecar) kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// connect is a client of s, closed when the test ends.
func connect(t *testing.T, s *sidecar, opts ...dsp.Option) *dsp.Client {
	t.Helper()
	client, err := dsp.Connect(context.Background(), s.address, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// bg is a context for calls bounded by the client's own timeouts.
var bg = context.Background()

func must[T any](t *testing.T) func(T, error) T {
	return func(value T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return value
	}
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// failure is err as a *dsp.Error; the test fails for anything else.
func failure(t *testing.T, err error) *dsp.Error {
	t.Helper()
	var failed *dsp.Error
	if !errors.As(err, &failed) {
		t.Fatalf("want a *dsp.Error, got %v", err)
	}
	return failed
}

func names(parts []dsp.Part) []string {
	out := []string{}
	for _, p := range parts {
		if !builtins[p.Name] {
			out = append(out, p.Name)
		}
	}
	return out
}

func toolNames(a *dsp.Assembly) []string {
	out := []string{}
	for _, tool := range a.Tools {
		out = append(out, tool.Name)
	}
	return out
}

func text(a *dsp.Assembly, name string) string {
	for _, p := range append(append([]dsp.Part{}, a.Sections...), a.Contexts...) {
		if p.Name == name {
			return p.Text
		}
	}
	return "<absent>"
}

func equal[T comparable](t *testing.T, got, want []T) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

// waitFor polls condition until it holds, failing after 15 s.
func waitFor(t *testing.T, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freePort is a loopback port nobody listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	check(t, err)
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port
}
