package dsp_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A scripted sidecar: a gRPC server in the test process whose every answer a
// test writes. The real sidecar never misbehaves on purpose; this one sends a
// wrong message, stays silent, cuts a stream or sends an error without a
// reason, whatever the test's script says. The defaults answer like a
// well-behaved sidecar. The Go twin of tests/scripted.py and the TypeScript
// client's test/scripted.ts.

// scriptedCallTimeout is the call timeout of the clients the scripted tests connect.
const scriptedCallTimeout = 500 * time.Millisecond

type script struct {
	pb.UnimplementedSystemPromptServiceServer

	// opened answers a session's start; nil: SessionOpened with a fresh id.
	opened func(n int) *pb.OpenSessionResponse
	// register answers RegisterSection; nil: a fresh registration id.
	register func(ctx context.Context, request *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error)
	// silentUpdates and silentDisposals leave Update and Dispose unanswered.
	silentUpdates, silentDisposals atomic.Bool
	// assemble answers Assemble; nil: an empty assembly.
	assemble func(ctx context.Context, request *pb.AssembleRequest) (*pb.AssembleResponse, error)
	// listen serves a Listen stream after its start; nil: ListenerRegistered, then reads until the end.
	listen func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error
	// watch serves WatchChanges; nil: WatchSubscribed, then silence until the end.
	watch func(n int, request *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error
	// list serves ListRegistrations; nil: a listing of nothing at revision 10.
	list func(request *pb.ListRegistrationsRequest, stream pb.SystemPromptService_ListRegistrationsServer) error
	// watchPrompt serves WatchPrompt; nil: silence until the end.
	watchPrompt func(n int, request *pb.WatchPromptRequest, stream pb.SystemPromptService_WatchPromptServer) error

	sessions  chan *scriptedSession // every session opened, as it opens
	listens   atomic.Int32
	watches   atomic.Int32
	prompts   atomic.Int32 // WatchPrompt calls
	ids       atomic.Int32
	openCalls atomic.Int32 // streams of any kind still open on the server
}

// scriptedSession is one open session stream, for the test to talk on.
type scriptedSession struct {
	id       string
	start    *pb.SessionStart // what the client opened it with
	stream   pb.SystemPromptService_OpenSessionServer
	received chan *pb.OpenSessionRequest
	done     chan struct{}
	ending   chan error // what the sidecar ends the stream with
}

func (s *scriptedSession) send(t *testing.T, message *pb.OpenSessionResponse) {
	t.Helper()
	check(t, s.stream.Send(message))
}

// provided is the client's next ProvideResponse on the session.
func (s *scriptedSession) provided(t *testing.T, wait time.Duration) *pb.ProvideResponse {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case m := <-s.received:
			if p := m.GetProvided(); p != nil {
				return p
			}
		case <-timeout:
			return nil
		}
	}
}

func (s *script) id(prefix string) string { return fmt.Sprintf("%s%d", prefix, s.ids.Add(1)) }

func (s *script) OpenSession(stream pb.SystemPromptService_OpenSessionServer) error {
	s.openCalls.Add(1)
	defer s.openCalls.Add(-1)
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	session := &scriptedSession{
		id: s.id("session-"), start: first.GetStart(), stream: stream, received: make(chan *pb.OpenSessionRequest, 100),
		done: make(chan struct{}), ending: make(chan error, 1),
	}
	defer close(session.done)
	opened := &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Opened{Opened: &pb.SessionOpened{SessionId: session.id}}}
	if s.opened != nil {
		opened = s.opened(int(s.ids.Load()))
	}
	if opened != nil {
		if err := stream.Send(opened); err != nil {
			return err
		}
	}
	if s.sessions != nil {
		s.sessions <- session
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			message, err := stream.Recv()
			if err != nil {
				return
			}
			session.received <- message
		}
	}()
	select {
	case <-ended:
		return nil
	case err := <-session.ending:
		return err
	}
}

func (s *script) RegisterSection(ctx context.Context, request *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
	if s.register != nil {
		return s.register(ctx, request)
	}
	return &pb.RegisterSectionResponse{RegistrationId: s.id("registration-")}, nil
}

func (s *script) Dispose(ctx context.Context, _ *pb.DisposeRequest) (*pb.DisposeResponse, error) {
	if s.silentDisposals.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &pb.DisposeResponse{}, nil
}

func (s *script) Update(ctx context.Context, _ *pb.UpdateRequest) (*pb.UpdateResponse, error) {
	if s.silentUpdates.Load() {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &pb.UpdateResponse{Revision: 2}, nil
}

func (s *script) Assemble(ctx context.Context, request *pb.AssembleRequest) (*pb.AssembleResponse, error) {
	if s.assemble != nil {
		return s.assemble(ctx, request)
	}
	return &pb.AssembleResponse{Assembly: &pb.PromptAssembly{}}, nil
}

func (s *script) Listen(stream pb.SystemPromptService_ListenServer) error {
	s.openCalls.Add(1)
	defer s.openCalls.Add(-1)
	s.listens.Add(1)
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if s.listen != nil {
		return s.listen(first.GetStart(), stream)
	}
	if err := stream.Send(registered(first.GetStart())); err != nil {
		return err
	}
	return drain(stream)
}

// registered confirms a listener with every feature its start offered.
func registered(start *pb.ListenStart) *pb.ListenResponse {
	return registeredWith(start.GetFeatures()...)
}

// registeredWith confirms a listener with features, as a sidecar that knows only those.
func registeredWith(features ...string) *pb.ListenResponse {
	return &pb.ListenResponse{Kind: &pb.ListenResponse_Registered{Registered: &pb.ListenerRegistered{
		RegistrationId: "listener", Features: features,
	}}}
}

// drain reads a listener stream until the client ends it.
func drain(stream pb.SystemPromptService_ListenServer) error {
	for {
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

// serving counts a stream open until done, and one more call of its kind (calls).
func (s *script) serving(calls *atomic.Int32) (n int, done func()) {
	s.openCalls.Add(1)
	return int(calls.Add(1)), func() { s.openCalls.Add(-1) }
}

func (s *script) WatchChanges(request *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
	n, done := s.serving(&s.watches)
	defer done()
	if s.watch != nil {
		return s.watch(n, request, stream)
	}
	if err := stream.Send(subscribed(1, "i")); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (s *script) ListRegistrations(request *pb.ListRegistrationsRequest, stream pb.SystemPromptService_ListRegistrationsServer) error {
	if s.list != nil {
		return s.list(request, stream)
	}
	return stream.Send(&pb.ListRegistrationsResponse{Revision: 10})
}

func (s *script) WatchPrompt(request *pb.WatchPromptRequest, stream pb.SystemPromptService_WatchPromptServer) error {
	n, done := s.serving(&s.prompts)
	defer done()
	if s.watchPrompt == nil {
		<-stream.Context().Done() // silence
		return nil
	}
	return s.watchPrompt(n, request, stream)
}

func subscribed(revision uint64, incarnation string) *pb.WatchChangesResponse {
	return &pb.WatchChangesResponse{Incarnation: incarnation, Kind: &pb.WatchChangesResponse_Subscribed{
		Subscribed: &pb.WatchSubscribed{Revision: revision, Incarnation: incarnation},
	}}
}

func changeEvent(revision uint64, name string) *pb.WatchChangesResponse {
	return &pb.WatchChangesResponse{Incarnation: "i", Kind: &pb.WatchChangesResponse_Event{Event: &pb.ChangeEvent{
		Revision: revision, Kind: pb.ChangeKind_CHANGE_KIND_SECTION, Action: pb.ChangeAction_CHANGE_ACTION_REGISTERED, Name: name,
	}}}
}

// serveScript serves s on a free loopback port until the test ends.
func serveScript(t *testing.T, s *script) string {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	check(t, err)
	server := grpc.NewServer()
	pb.RegisterSystemPromptServiceServer(server, s)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return listener.Addr().String()
}

// connectScripted is a client of the scripted sidecar, closed when the test ends.
func connectScripted(t *testing.T, address string) *dsp.Client {
	t.Helper()
	client := must[*dsp.Client](t)(dsp.Connect(bg, address, dsp.WithCallTimeout(scriptedCallTimeout)))
	t.Cleanup(func() { client.Close() })
	return client
}

// nothingLeft fails unless every stream the client opened on s is over soon.
func nothingLeft(t *testing.T, s *script) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.openCalls.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the client left %d streams open on the sidecar", s.openCalls.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantError(t *testing.T, err error, code codes.Code, reason dsp.Reason) *dsp.Error {
	t.Helper()
	failed := failure(t, err)
	if failed.Code != code || failed.Reason != reason {
		t.Fatalf("want %v %s, got %v %s: %s", code, reason, failed.Code, failed.Reason, failed.Message)
	}
	return failed
}
