package dsp_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	"google.golang.org/grpc/codes"
)

// helperVariable makes the test binary a helper process (see runHelper).
const helperVariable = "DSP_GO_TEST_HELPER"

// runHelper is an agent process for the tests to kill: it registers a static
// and a dynamic section, says so, and waits.
func runHelper(mode string) int {
	client, err := dsp.Connect(context.Background(), "")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := client.Section(context.Background(), "helper-static", 10, "From a helper."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, err = client.SectionFunc(context.Background(), "helper-dynamic", 20, func(context.Context, dsp.AssembleContext) (string, error) {
		return "Dynamic from a helper.", nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("registered", mode)
	select {}
}

func TestAKilledProcesssRegistrationsVanish(t *testing.T) {
	s := shared(t)
	client := connect(t, s)
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), helperVariable+"=agent", "DSP_ADDRESS="+s.address)
	stdout := must[interface{ Read([]byte) (int, error) }](t)(helper.StdoutPipe())
	check(t, helper.Start())
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "registered") {
		t.Fatalf("the helper did not register: %q %v", line, err)
	}
	assembly := must[*dsp.Assembly](t)(client.Assemble(bg))
	equal(t, names(assembly.Sections), []string{"helper-static", "helper-dynamic"})

	check(t, helper.Process.Kill())
	waitFor(t, "the killed helper's registrations to go", func() bool {
		assembly, err := client.Assemble(bg)
		return err == nil && len(names(assembly.Sections)) == 0
	})
}

func TestClosingAClientDisposesWhatItRegistered(t *testing.T) {
	s := shared(t)
	watcher := connect(t, s)
	agent, err := dsp.Connect(bg, s.address)
	check(t, err)
	must[*dsp.Handle[string]](t)(agent.Section(bg, "mine", 1, "Mine."))
	scope := must[*dsp.Scope](t)(agent.Scope(bg, "go-closing"))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "scoped", 1, "Scoped."))
	equal(t, names(must[*dsp.Assembly](t)(watcher.Assemble(bg, dsp.ForScope("go-closing"))).Sections), []string{"mine", "scoped"})
	check(t, agent.Close())
	check(t, agent.Close())
	equal(t, names(must[*dsp.Assembly](t)(watcher.Assemble(bg, dsp.ForScope("go-closing"))).Sections), []string{})
	_, err = agent.Section(bg, "late", 1, "Late.")
	if failed := failure(t, err); failed.Reason != dsp.ReasonSessionClosed || failed.Code != codes.FailedPrecondition {
		t.Fatalf("a call on a closed client: %+v", failed)
	}
}

// restartable is a sidecar the test may restart on the same address.
func restartable(t *testing.T) (*sidecar, func()) {
	s := startSidecar(t, nil)
	address := s.address
	return s, func() {
		began := time.Now()
		s.stop()
		t.Logf("stop took %s", time.Since(began))
		began = time.Now()
		s = restartAt(t, address, nil)
		t.Logf("start took %s", time.Since(began))
	}
}

func TestASidecarRestartReplaysEverythingAndThePromptIsByteIdentical(t *testing.T) {
	s, restart := restartable(t)
	client := connect(t, s, dsp.WithCallTimeout(2*time.Second))
	must[*dsp.Handle[string]](t)(client.Section(bg, "static", 10, "Static {{model}}."))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 20, func(_ context.Context, a dsp.AssembleContext) (string, error) {
		return fmt.Sprintf("Dynamic for %v.", a.Get("who")), nil
	}))
	model := must[*dsp.VariableHandle](t)(client.Variable(bg, "model", "m1"))
	must[uint64](t)(model.Update(bg, "m2")) // the replay makes the latest value
	unset := must[*dsp.VariableHandle](t)(client.Variable(bg, "unset", "soon gone"))
	must[uint64](t)(unset.Unset(bg))
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(client.Tools(bg, dsp.ToolProviderResult{
		Schemas: []dsp.ToolSchema{{Name: "tool", Description: "d", ParametersJSON: `{"type": "object"}`}},
	}))
	scope := must[*dsp.Scope](t)(client.Scope(bg, "agent", dsp.WithParent("team")))
	must[*dsp.Handle[string]](t)(scope.Section(bg, "scoped", 30, "Scoped."))
	gone := must[*dsp.Handle[string]](t)(client.Section(bg, "gone", 40, "Gone."))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		a.Sections = append(a.Sections, dsp.Part{Name: "listener", Text: "Listened."})
		return next.Tail(a)
	}))
	check(t, gone.Dispose(bg))
	fields := dsp.WithFields(map[string]any{"who": "x"})
	before := must[*dsp.Rendered](t)(client.Render(bg, dsp.ForScope("agent"), fields))
	session := client.SessionID()

	restart()
	waitFor(t, "the reconnect", func() bool { return client.Connected() && client.SessionID() != session })

	after := must[*dsp.Rendered](t)(client.Render(bg, dsp.ForScope("agent"), fields))
	if after.Prompt != before.Prompt {
		t.Fatalf("the prompt after the restart:\n%q\nbefore:\n%q", after.Prompt, before.Prompt)
	}
	if !strings.Contains(after.Prompt, "Static m2.") {
		t.Fatalf("the updated value is replayed: %q", after.Prompt)
	}
	equal(t, names(after.Assembly.Sections), []string{"static", "dynamic", "scoped", "listener"})
	unsetFound := false
	for _, v := range after.Assembly.Variables {
		if v.Name == "unset" {
			unsetFound = v.Value == nil // the replay makes it unset, as it was last
		}
	}
	if !unsetFound {
		t.Fatalf("the unset variable after the replay: %+v", after.Assembly.Variables)
	}
	if after.Assembly.Tools[0].ParametersJSON != `{"type": "object"}` {
		t.Fatalf("tool parameters, byte for byte: %s", after.Assembly.Tools[0].ParametersJSON)
	}
	check(t, scope.Dispose(bg)) // a handle from before the restart still works
	equal(t, names(must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope("agent"))).Sections), []string{"static", "dynamic", "listener"})
}

func TestCallsWhileTheSidecarIsDownFailFastOrWaitWithADeadline(t *testing.T) {
	s, _ := restartable(t)
	address := s.address
	client := connect(t, s, dsp.WithCallTimeout(2*time.Second))
	must[*dsp.Handle[string]](t)(client.Section(bg, "kept", 1, "Kept."))
	s.stop()
	waitFor(t, "the client to see the sidecar go", func() bool { return !client.Connected() })
	_, err := client.Assemble(bg)
	if failed := failure(t, err); failed.Code != codes.Unavailable || failed.Reason != dsp.ReasonSidecarUnavailable {
		t.Fatalf("while down, without a deadline: %+v", failed)
	}
	go func() {
		time.Sleep(300 * time.Millisecond)
		restartAt(t, address, nil)
	}()
	assembly := must[*dsp.Assembly](t)(client.Assemble(within(t, 20*time.Second)))
	equal(t, names(assembly.Sections), []string{"kept"})
}

func TestWaitForReadyConnectsToASidecarThatStartsLater(t *testing.T) {
	address := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	go func() {
		time.Sleep(500 * time.Millisecond)
		restartAt(t, address, nil)
	}()
	client, err := dsp.Connect(bg, address, dsp.WithWaitForReady(30*time.Second))
	check(t, err)
	t.Cleanup(func() { client.Close() })
	must[*dsp.Handle[string]](t)(client.Section(bg, "late", 1, "Late."))

	_, err = dsp.Connect(bg, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	if failed := failure(t, err); failed.Code != codes.Unavailable {
		t.Fatalf("nobody listening: %+v", failed)
	}
}

func TestNothingOfAClosedClientIsLeftRunning(t *testing.T) {
	s := shared(t)
	connect(t, s).Close() // the first client starts what a process keeps (gRPC's own workers)
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	client, err := dsp.Connect(bg, s.address)
	check(t, err)
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "d", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		return "D.", nil
	}))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		return next.Call(a)
	}))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
	must[*dsp.Assembly](t)(client.Assemble(bg))
	check(t, client.Close())
	if _, err := changes.Next(bg); err == nil {
		t.Fatal("a change stream outlived its client")
	}
	waitFor(t, "the client's goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

func TestAClientClosedWhileItReconnectsClosesAtOnce(t *testing.T) {
	s, _ := restartable(t)
	client, err := dsp.Connect(bg, s.address, dsp.WithCallTimeout(2*time.Second))
	check(t, err)
	must[*dsp.Handle[string]](t)(client.Section(bg, "kept", 1, "Kept."))
	s.stop()
	waitFor(t, "the client to see the sidecar go", func() bool { return !client.Connected() })
	time.Sleep(300 * time.Millisecond) // into the reconnect's backoff
	began := time.Now()
	check(t, client.Close())
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("closing took %s", took)
	}
	_, err = client.Assemble(bg)
	if failure(t, err).Reason != dsp.ReasonSessionClosed {
		t.Fatalf("after close: %v", err)
	}
}

func TestAFailedOrAbandonedConnectLeavesNothingRunning(t *testing.T) {
	address := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	_, err := dsp.Connect(bg, address) // warm up gRPC's process-wide workers
	failure(t, err)
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := 0; i < 3; i++ {
		_, err := dsp.Connect(bg, address)
		if failure(t, err).Code != codes.Unavailable {
			t.Fatalf("nobody listening: %v", err)
		}
		ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
		_, err = dsp.Connect(ctx, address, dsp.WithWaitForReady(time.Minute))
		cancel()
		if failure(t, err).Code != codes.DeadlineExceeded {
			t.Fatalf("an abandoned connect: %v", err)
		}
	}
	waitFor(t, "the failed connects' goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}
