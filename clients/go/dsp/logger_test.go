package dsp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// WithLogger: what the client does on its own (a lost session, its reconnect and
// replay, an ejected callback made again) is told to the caller's logger, on a
// real sidecar and on a scripted one.

// recorder is a Logger (slog's three methods) that keeps each line as "LEVEL msg k=v ...".
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) add(level, msg string, args []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	line := level + " " + msg
	for i := 0; i+1 < len(args); i += 2 {
		line += fmt.Sprintf(" %v=%v", args[i], args[i+1])
	}
	r.lines = append(r.lines, line)
}

func (r *recorder) Debug(msg string, args ...any) { r.add("DEBUG", msg, args) }
func (r *recorder) Info(msg string, args ...any)  { r.add("INFO", msg, args) }
func (r *recorder) Warn(msg string, args ...any)  { r.add("WARN", msg, args) }

// said is the first line that starts with prefix, "" while there is none.
func (r *recorder) said(prefix string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, line := range r.lines {
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	return ""
}

// wantSaid waits for a line that starts with prefix and returns it.
func (r *recorder) wantSaid(t *testing.T, prefix string) string {
	t.Helper()
	waitFor(t, fmt.Sprintf("the log line %q", prefix), func() bool { return r.said(prefix) != "" })
	return r.said(prefix)
}

func TestTheLoggerHearsARestartedSidecarsReconnectAndReplay(t *testing.T) {
	s, restart := restartable(t)
	log := &recorder{}
	client := connect(t, s, dsp.WithCallTimeout(2*time.Second), dsp.WithLogger(log))
	lost := client.SessionID()
	must[*dsp.Handle[string]](t)(client.Section(bg, "static", 10, "Static."))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 20, cachedText))
	if said := log.said("INFO") + log.said("WARN"); said != "" {
		t.Fatalf("the client told of what the caller did: %q", said)
	}
	restart()
	log.wantSaid(t, "WARN dsp: the session ended; reconnecting session="+lost)
	line := log.wantSaid(t, "INFO dsp: reconnected as a new session")
	if want := fmt.Sprintf("session=%s replayed=2", client.SessionID()); !strings.HasSuffix(line, want) {
		t.Fatalf("the reconnect: %q, want ...%s", line, want)
	}
}

func TestTheLoggerHearsAnEjectedProviderMadeAgain(t *testing.T) {
	log := &recorder{}
	client := connect(t, sharedWith(t, slowCallbacks), dsp.WithLogger(log))
	var calls int
	var mu sync.Mutex
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "go-logged-clock", 10, func(ctx context.Context, _ dsp.AssembleContext) (string, error) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			<-ctx.Done() // stuck, the first time
		}
		return "It is noon.", nil
	}))
	_, err := client.Assemble(bg)
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonProviderTimeout)
	line := log.wantSaid(t, "WARN dsp: the sidecar ejected a callback; registering it again after a backoff")
	if !strings.Contains(line, `why=section provider "go-logged-clock" (global) did not answer within 0.5s`) || !strings.Contains(line, "backoff=1s") {
		t.Fatalf("the ejection: %q", line)
	}
}

func TestTheLoggerHearsEachAttemptToReachAScriptedSidecarAgain(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 8)}
	refused := 0
	s.register = func(context.Context, *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		refused++
		if refused > 1 && refused < 4 { // the first replay twice: the sidecar is not ready yet
			return nil, status.Error(codes.Unavailable, "starting")
		}
		return &pb.RegisterSectionResponse{RegistrationId: s.id("registration-")}, nil
	}
	log := &recorder{}
	client := must[*dsp.Client](t)(dsp.Connect(bg, serveScript(t, s), dsp.WithCallTimeout(scriptedCallTimeout), dsp.WithLogger(log)))
	t.Cleanup(func() { client.Close() })
	first := <-s.sessions
	must[*dsp.Handle[string]](t)(client.Section(bg, "s", 1, "S."))
	first.ending <- status.Error(codes.Unavailable, "cut")
	log.wantSaid(t, "WARN dsp: the session ended; reconnecting session="+first.id)
	retry := log.wantSaid(t, "INFO dsp: sidecar unavailable, retrying")
	if !strings.Contains(retry, "error=") || !strings.Contains(retry, "starting") {
		t.Fatalf("the retry: %q", retry)
	}
	log.wantSaid(t, "INFO dsp: reconnected as a new session")
	for _, id := range []string{first.id, client.SessionID()} {
		if log.said("DEBUG dsp: session opened session="+id+" sidecar=") == "" {
			t.Fatalf("no session %s opened", id)
		}
	}
}

func TestTheLoggerHearsAScriptedListenerEjectedWithTheSidecarsWords(t *testing.T) {
	ejected := make(chan struct{}, 1)
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		if err := stream.Send(registered(start)); err != nil {
			return err
		}
		select {
		case ejected <- struct{}{}: // the first stream: ejected at once
			return stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_Ejected{Ejected: &pb.CallbackEjected{
				RegistrationId: "listener", Reason: "LISTENER_TIMEOUT", Message: `listener "sign" did not answer within 5s`,
			}}})
		default:
			return drain(stream)
		}
	}}
	log := &recorder{}
	client := must[*dsp.Client](t)(dsp.Connect(bg, serveScript(t, s), dsp.WithCallTimeout(scriptedCallTimeout), dsp.WithLogger(log)))
	t.Cleanup(func() { client.Close() })
	must[*dsp.Registration](t)(client.OnAssemble(bg, passThrough, dsp.ListenerName("sign")))
	line := log.wantSaid(t, "WARN dsp: the sidecar ejected a callback")
	if !strings.Contains(line, `why=listener "sign" did not answer within 5s`) {
		t.Fatalf("the ejection: %q", line)
	}
}

func TestWithoutALoggerTheClientStillReconnects(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 8)}
	client := connectScripted(t, serveScript(t, s))
	first := <-s.sessions
	first.ending <- status.Error(codes.Unavailable, "cut")
	second := <-s.sessions
	waitFor(t, "the new session", func() bool { return client.Connected() && client.SessionID() == second.id })
}
