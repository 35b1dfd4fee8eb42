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
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
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

	sessions  chan *scriptedSession // every session opened, as it opens
	listens   atomic.Int32
	watches   atomic.Int32
	ids       atomic.Int32
	openCalls atomic.Int32 // streams of any kind still open on the server
}

// scriptedSession is one open session stream, for the test to talk on.
type scriptedSession struct {
	id       string
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
	if _, err := stream.Recv(); err != nil {
		return err
	}
	session := &scriptedSession{
		id: s.id("session-"), stream: stream, received: make(chan *pb.OpenSessionRequest, 100),
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

func registered(start *pb.ListenStart) *pb.ListenResponse {
	return &pb.ListenResponse{Kind: &pb.ListenResponse_Registered{Registered: &pb.ListenerRegistered{
		RegistrationId: "listener", Features: start.GetFeatures(),
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

func (s *script) WatchChanges(request *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
	s.openCalls.Add(1)
	defer s.openCalls.Add(-1)
	n := int(s.watches.Add(1))
	if s.watch != nil {
		return s.watch(n, request, stream)
	}
	if err := stream.Send(subscribed(1, "i")); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
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

func TestASessionTheSidecarNeverConfirmsFailsConnectWithinTheCallTimeout(t *testing.T) {
	s := &script{opened: func(int) *pb.OpenSessionResponse { return nil }}
	address := serveScript(t, s)
	started := time.Now()
	_, err := dsp.Connect(bg, address, dsp.WithCallTimeout(scriptedCallTimeout))
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	if elapsed := time.Since(started); elapsed > 3*time.Second {
		t.Fatalf("connect took %s", elapsed)
	}
	nothingLeft(t, s)
}

func TestASessionStreamThatDoesNotStartWithOpenedIsAProtocolError(t *testing.T) {
	s := &script{opened: func(int) *pb.OpenSessionResponse {
		return &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Cancel{Cancel: &pb.ProvideCancel{CallId: 1}}}
	}}
	_, err := dsp.Connect(bg, serveScript(t, s), dsp.WithCallTimeout(scriptedCallTimeout))
	wantError(t, err, codes.Internal, dsp.ReasonProtocolError)
	nothingLeft(t, s)
}

func TestASecondOpenedIsIgnoredAndTheSessionKeepsItsFirstID(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	session.send(t, &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Opened{Opened: &pb.SessionOpened{SessionId: "other"}}})
	must[*dsp.Handle[string]](t)(client.Section(bg, "s", 1, "S."))
	if client.SessionID() != session.id {
		t.Fatalf("the session id changed to %q", client.SessionID())
	}
}

func provide(callID uint64, fields string, keys ...string) *pb.OpenSessionResponse {
	request := &pb.ProvideRequest{CallId: callID, Context: &pb.AssembleContext{FieldsJson: fields}}
	for _, key := range keys {
		request.Calls = append(request.Calls, &pb.ProvideCall{ProviderKey: key, Kind: pb.ProviderKind_PROVIDER_KIND_SECTION})
	}
	return &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Provide{Provide: request}}
}

func TestProvideRequestsTheClientCannotAnswerAreAnsweredWithErrors(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	var keys []string
	s.register = func(_ context.Context, r *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		keys = append(keys, r.GetDynamic().GetProviderKey())
		return &pb.RegisterSectionResponse{RegistrationId: "r"}, nil
	}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "d", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		return "D.", nil
	}))

	session.send(t, provide(1, "", "never-registered"))
	answer := session.provided(t, 5*time.Second)
	if answer.GetCallId() != 1 || answer.GetValues()[0].GetError() == nil {
		t.Fatalf("an unknown key: %v", answer)
	}
	session.send(t, provide(2, "{not json", keys[0]))
	answer = session.provided(t, 5*time.Second)
	if answer.GetCallId() != 2 || answer.GetValues()[0].GetError() == nil {
		t.Fatalf("fields that are not JSON: %v", answer)
	}
	session.send(t, provide(3, `{"a": 1}`, keys[0]))
	if answer = session.provided(t, 5*time.Second); answer.GetValues()[0].GetText() != "D." {
		t.Fatalf("a good request: %v", answer)
	}
}

func TestAProvideRequestRepeatedWhileItRunsIsAnsweredOnce(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	var key string
	s.register = func(_ context.Context, r *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		key = r.GetDynamic().GetProviderKey()
		return &pb.RegisterSectionResponse{RegistrationId: "r"}, nil
	}
	release := make(chan struct{})
	var calls atomic.Int32
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "slow", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		calls.Add(1)
		<-release
		return "Slow.", nil
	}))
	session.send(t, provide(7, "", key))
	session.send(t, provide(7, "", key))
	time.Sleep(100 * time.Millisecond)
	close(release)
	if answer := session.provided(t, 5*time.Second); answer.GetCallId() != 7 {
		t.Fatalf("the answer: %v", answer)
	}
	if again := session.provided(t, 300*time.Millisecond); again != nil || calls.Load() != 1 {
		t.Fatalf("answered twice (%v) or asked %d times", again, calls.Load())
	}
}

func TestARegistrationTheSidecarNeverAnswersFailsAndTheSessionIsMadeAgain(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	var silent atomic.Bool
	silent.Store(true)
	s.register = func(ctx context.Context, _ *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		if silent.Load() {
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return &pb.RegisterSectionResponse{RegistrationId: "r"}, nil
	}
	client := connectScripted(t, serveScript(t, s))
	first := <-s.sessions
	_, err := client.Section(bg, "unanswered", 1, "U.")
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	silent.Store(false)
	select {
	case <-first.done: // it may have been registered there: its session is ended
	case <-time.After(5 * time.Second):
		t.Fatal("the session of the unanswered registration was not ended")
	}
	second := <-s.sessions
	waitFor(t, "the new session", func() bool { return client.Connected() && client.SessionID() == second.id })
	must[*dsp.Handle[string]](t)(client.Section(bg, "answered", 1, "A."))
}

func TestAnAssemblyTheSidecarNeverAnswersFailsAtItsDeadline(t *testing.T) {
	s := &script{assemble: func(ctx context.Context, _ *pb.AssembleRequest) (*pb.AssembleResponse, error) {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}}
	client := connectScripted(t, serveScript(t, s))
	_, err := client.Assemble(within(t, 300*time.Millisecond))
	wantError(t, err, codes.DeadlineExceeded, dsp.ReasonUnknown)
}

func withDetails(code codes.Code, message string, reason string) error {
	info := &anypb.Any{TypeUrl: "type.googleapis.com/google.rpc.ErrorInfo", Value: append([]byte{10, byte(len(reason))}, reason...)}
	return status.ErrorProto(&spb.Status{Code: int32(code), Message: message, Details: []*anypb.Any{info}})
}

func TestErrorsWithoutOrWithUnknownReasons(t *testing.T) {
	answers := []error{
		status.Error(codes.Internal, "no details"),
		status.Error(codes.Unavailable, "going away"),
		withDetails(codes.FailedPrecondition, "from the future", "A_NEWER_REASON"),
		withDetails(codes.AlreadyExists, "taken", "DUPLICATE_NAME"),
	}
	var n atomic.Int32
	s := &script{assemble: func(context.Context, *pb.AssembleRequest) (*pb.AssembleResponse, error) {
		return nil, answers[n.Add(1)-1]
	}}
	client := connectScripted(t, serveScript(t, s))
	_, err := client.Assemble(bg)
	wantError(t, err, codes.Internal, dsp.ReasonUnknown)
	_, err = client.Assemble(bg)
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	_, err = client.Assemble(bg)
	if failed := wantError(t, err, codes.FailedPrecondition, "A_NEWER_REASON"); failed.Message != "from the future" {
		t.Fatalf("the message: %q", failed.Message)
	}
	_, err = client.Assemble(bg)
	wantError(t, err, codes.AlreadyExists, dsp.ReasonDuplicateName)
}

func passThrough(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
	return next.Call(a)
}

func TestAListenerTheSidecarNeverConfirmsOrConfirmsWrongly(t *testing.T) {
	silent := &script{listen: func(_ *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		<-stream.Context().Done()
		return nil
	}}
	client := connectScripted(t, serveScript(t, silent))
	_, err := client.OnAssemble(bg, passThrough)
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)

	wrong := &script{listen: func(_ *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		_ = stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_Cancel{Cancel: &pb.ListenerCancel{InvocationId: 1}}})
		return drain(stream)
	}}
	other := connectScripted(t, serveScript(t, wrong))
	_, err = other.OnAssemble(bg, passThrough)
	wantError(t, err, codes.Internal, dsp.ReasonProtocolError)
	client.Close()
	other.Close()
	nothingLeft(t, silent)
	nothingLeft(t, wrong)
}

// invoke runs one invocation on a scripted listener stream and returns the client's first reply.
func invoke(t *testing.T, stream pb.SystemPromptService_ListenServer, id uint64, tools ...string) *pb.ListenRequest {
	t.Helper()
	assembly := &pb.PromptAssembly{}
	for _, name := range tools {
		assembly.Tools = append(assembly.Tools, &pb.ToolSchema{Name: name, ParametersJson: "{}"})
	}
	check(t, stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_Invocation{Invocation: &pb.ListenerInvocation{
		InvocationId: id, Assembly: assembly, Context: &pb.AssembleContext{},
	}}}))
	reply, err := stream.Recv()
	check(t, err)
	return reply
}

func nextResult(id uint64, slots []int32, tools ...string) *pb.ListenResponse {
	assembly := &pb.PromptAssembly{}
	for _, name := range tools {
		assembly.Tools = append(assembly.Tools, &pb.ToolSchema{Name: name, ParametersJson: "{}"})
	}
	return &pb.ListenResponse{Kind: &pb.ListenResponse_NextResult{NextResult: &pb.ListenerNextResult{
		InvocationId: id, Assembly: assembly, ToolSlots: slots,
	}}}
}

func TestListenerRepliesUseToolSlotsAndBadSlotsFailNext(t *testing.T) {
	replies := make(chan *pb.ListenRequest, 10)
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		// A good round: next with the tools as slots, a result with slots.
		next := invoke(t, stream, 1, "a", "b")
		replies <- next
		check(t, stream.Send(nextResult(1, []int32{1, -1, 0}, "new")))
		result, err := stream.Recv()
		check(t, err)
		replies <- result
		// Slots that cannot be right: next() fails, and so does the listener.
		for id, slots := range map[uint64][]int32{2: {5}, 3: {-1, -1}} {
			invoke(t, stream, id, "a")
			check(t, stream.Send(nextResult(id, slots, "one")))
			reply, err := stream.Recv()
			check(t, err)
			replies <- reply
		}
		return drain(stream)
	}}
	client := connectScripted(t, serveScript(t, s))
	must[*dsp.Registration](t)(client.OnAssemble(bg, passThrough))
	next := (<-replies).GetNext()
	if next == nil || len(next.GetAssembly().GetTools()) != 0 || fmt.Sprint(next.GetToolSlots()) != "[0 1]" {
		t.Fatalf("unchanged tools go to next() as slots: %v", next)
	}
	result := (<-replies).GetResult()
	if result == nil || fmt.Sprint(result.GetToolSlots()) != "[1 -1 0]" || result.GetAssembly().GetTools()[0].GetName() != "new" {
		t.Fatalf("the result names the invocation's tools by slot: %v", result)
	}
	for i := 0; i < 2; i++ {
		failure := (<-replies).GetFailure()
		if failure == nil || !contains(failure.GetMessage(), "protocol error") {
			t.Fatalf("bad slots fail the listener with a protocol error: %v", failure)
		}
	}
}

func TestARepeatedInvocationRunsTheListenerOnce(t *testing.T) {
	var runs atomic.Int32
	release := make(chan struct{})
	replies := make(chan *pb.ListenRequest, 4)
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		invocation := &pb.ListenResponse{Kind: &pb.ListenResponse_Invocation{Invocation: &pb.ListenerInvocation{
			InvocationId: 9, Assembly: &pb.PromptAssembly{}, Context: &pb.AssembleContext{},
		}}}
		check(t, stream.Send(invocation))
		check(t, stream.Send(invocation))
		// Out of place, and ignored: a next_result nobody waits for.
		check(t, stream.Send(nextResult(42, nil)))
		time.Sleep(200 * time.Millisecond) // the client has read both invocations by now
		close(release)
		for {
			reply, err := stream.Recv()
			if err != nil {
				return nil
			}
			replies <- reply
		}
	}}
	client := connectScripted(t, serveScript(t, s))
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, _ *dsp.Next) (*dsp.Assembly, error) {
		runs.Add(1)
		<-release
		return a, nil
	}))
	if reply := <-replies; reply.GetResult().GetInvocationId() != 9 {
		t.Fatalf("the reply: %v", reply)
	}
	select {
	case again := <-replies:
		t.Fatalf("a second reply: %v", again)
	case <-time.After(300 * time.Millisecond):
	}
	if runs.Load() != 1 {
		t.Fatalf("the listener ran %d times", runs.Load())
	}
}

func TestAListenerStreamEndedUnderNextEndsTheCallAndIsInstalledAgain(t *testing.T) {
	errs := make(chan error, 2)
	s := &script{sessions: make(chan *scriptedSession, 4)}
	s.listen = func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		if s.listens.Load() == 1 {
			invoke(t, stream, 1) // the client's next(); the sidecar then ends the stream
			return status.Error(codes.Unavailable, "listener stream dropped")
		}
		return drain(stream)
	}
	client := connectScripted(t, serveScript(t, s))
	first := <-s.sessions
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		_, err := next.Call(a)
		errs <- err
		return nil, err
	}))
	select {
	case err := <-errs:
		if err == nil {
			t.Fatal("next() returned without a result")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("next() did not end with the stream")
	}
	<-first.done // the session is ended, and made again with the listener
	<-s.sessions
	waitFor(t, "the listener installed again", func() bool { return s.listens.Load() == 2 && client.Connected() })
}

func TestAReplayThatGoesWrongIsDoneAgainOnANewSession(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 8)}
	var refuse atomic.Int32
	s.register = func(_ context.Context, r *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		if refuse.Add(-1) >= 0 {
			return nil, status.Error(codes.Unavailable, "not yet")
		}
		return &pb.RegisterSectionResponse{RegistrationId: s.id("r")}, nil
	}
	client := connectScripted(t, serveScript(t, s))
	first := <-s.sessions
	must[*dsp.Handle[string]](t)(client.Section(bg, "kept", 1, "Kept."))
	check(t, first.stream.Send(&pb.OpenSessionResponse{})) // a message of no kind this client knows: ignored
	refuse.Store(1)                                        // the first replay is refused: its session is ended, the next one replays
	first.ending <- status.Error(codes.Unavailable, "restarting")
	refused := <-s.sessions
	select {
	case <-refused.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the session of a refused replay was not ended")
	}
	replayed := <-s.sessions
	waitFor(t, "the replay", func() bool { return client.Connected() && client.SessionID() == replayed.id })
	if refuse.Load() >= 0 {
		t.Fatal("the replay never made the registration again")
	}
}

func TestAChangeStreamTheSidecarNeverConfirmsFailsWithinTheCallTimeout(t *testing.T) {
	s := &script{watch: func(_ int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		<-stream.Context().Done()
		return nil
	}}
	client := connectScripted(t, serveScript(t, s))
	_, err := client.WatchChanges(bg)
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	client.Close()
	nothingLeft(t, s)
}

func missed(first, count, resync uint64) *pb.WatchChangesResponse {
	return &pb.WatchChangesResponse{Incarnation: "i", Kind: &pb.WatchChangesResponse_Missed{Missed: &pb.ChangesMissed{
		FirstMissedRevision: first, Count: count, ResyncRevision: resync,
	}}}
}

func batch(missedAfter *pb.ChangesMissed, events ...*pb.WatchChangesResponse) *pb.WatchChangesResponse {
	b := &pb.ChangeBatch{Missed: missedAfter}
	for _, e := range events {
		b.Events = append(b.Events, e.GetEvent())
	}
	return &pb.WatchChangesResponse{Incarnation: "i", Kind: &pb.WatchChangesResponse_Batch{Batch: b}}
}

// watchScript sends messages after subscribing at revision 1, then holds the stream open.
func watchScript(messages ...*pb.WatchChangesResponse) *script {
	return &script{watch: func(n int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		_ = stream.Send(subscribed(1, "i"))
		for _, m := range messages {
			_ = stream.Send(m)
		}
		<-stream.Context().Done()
		return nil
	}}
}

func TestBatchesAndGapsAreDeliveredAsEventsInOrder(t *testing.T) {
	s := watchScript(
		batch(&pb.ChangesMissed{FirstMissedRevision: 4, Count: 3, ResyncRevision: 6}, changeEvent(2, "a"), changeEvent(3, "b")),
		changeEvent(7, "c"), missed(8, 1, 8), changeEvent(9, "d"),
	)
	client := connectScripted(t, serveScript(t, s))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
	defer changes.Close()
	var got []string
	for len(got) < 6 {
		change, err := changes.Next(within(t, 5*time.Second))
		check(t, err)
		switch c := change.(type) {
		case dsp.ChangeEvent:
			got = append(got, c.Name)
		case dsp.ChangesMissed:
			got = append(got, fmt.Sprintf("missed %d-%d", c.FirstRevision, c.ResyncRevision))
		}
	}
	equal(t, got, []string{"a", "b", "missed 4-6", "c", "missed 8-8", "d"})
	if changes.LastRevision() != 9 {
		t.Fatalf("the last revision: %d", changes.LastRevision())
	}
}

func TestChangesOutOfOrderEndTheStreamWithAProtocolError(t *testing.T) {
	for name, messages := range map[string][]*pb.WatchChangesResponse{
		"a revision going back": {changeEvent(3, "a"), changeEvent(2, "b")},
		"a gap before the last": {changeEvent(3, "a"), missed(2, 1, 3)},
		"a second subscribed":   {changeEvent(2, "a"), subscribed(2, "i")},
	} {
		t.Run(name, func(t *testing.T) {
			client := connectScripted(t, serveScript(t, watchScript(messages...)))
			changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
			_, err := changes.Next(within(t, 5*time.Second))
			check(t, err)
			_, err = changes.Next(within(t, 5*time.Second))
			wantError(t, err, codes.Internal, dsp.ReasonProtocolError)
			if _, err := changes.Next(bg); err == nil {
				t.Fatal("the stream goes on after a protocol error")
			}
		})
	}
}

func TestAChangeStreamTheSidecarEndsResumesAfterTheLastEventDelivered(t *testing.T) {
	requests := make(chan *pb.WatchChangesRequest, 4)
	s := &script{watch: func(n int, request *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		requests <- request
		_ = stream.Send(subscribed(1, "i"))
		if n == 1 {
			_ = stream.Send(changeEvent(2, "before"))
			return nil // ended with OK, as a draining sidecar does
		}
		_ = stream.Send(changeEvent(3, "after"))
		<-stream.Context().Done()
		return nil
	}}
	client := connectScripted(t, serveScript(t, s))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
	defer changes.Close()
	if first := nextEvent(t, changes); first.Name != "before" {
		t.Fatalf("first: %+v", first)
	}
	if second := nextEvent(t, changes); second.Name != "after" {
		t.Fatalf("after the resume: %+v", second)
	}
	<-requests
	resumed := <-requests
	if resumed.AfterRevision == nil || *resumed.AfterRevision != 2 || resumed.GetIncarnation() != "i" {
		t.Fatalf("the resume asks for what came after revision 2 of incarnation i: %v", resumed)
	}
	if len(resumed.GetFeatures()) != 1 || resumed.GetFeatures()[0] != "change-batches" {
		t.Fatalf("the watch lists its features: %v", resumed.GetFeatures())
	}
}

func TestAClientClosedWhileItsChangeStreamResumesEndsTheStream(t *testing.T) {
	s := &script{watch: func(n int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		if n == 1 {
			_ = stream.Send(subscribed(1, "i"))
			return nil
		}
		return status.Error(codes.Unavailable, "still restarting")
	}}
	client := connectScripted(t, serveScript(t, s))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
	ended := make(chan error, 1)
	go func() {
		_, err := changes.Next(bg)
		ended <- err
	}()
	waitFor(t, "the resumes", func() bool { return s.watches.Load() >= 2 })
	client.Close()
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("Next returned a change")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Next still waits after Close")
	}
	nothingLeft(t, s)
}

func TestAProvideCallOfAKindThisClientDoesNotKnowIsAnsweredWithAnError(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	var key string
	s.register = func(_ context.Context, r *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		key = r.GetDynamic().GetProviderKey()
		return &pb.RegisterSectionResponse{RegistrationId: "r"}, nil
	}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "d", 1, func(context.Context, dsp.AssembleContext) (string, error) {
		return "D.", nil
	}))
	request := provide(1, "", key)
	request.GetProvide().Calls[0].Kind = pb.ProviderKind(99) // a newer sidecar's kind
	session.send(t, request)
	if answer := session.provided(t, 5*time.Second); answer.GetValues()[0].GetError() == nil {
		t.Fatalf("an unknown kind: %v", answer)
	}
}

func TestAnUpdateOrDisposalTheSidecarNeverAnswersEndsTheSession(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 8)}
	client := connectScripted(t, serveScript(t, s))
	first := <-s.sessions
	handle := must[*dsp.Handle[string]](t)(client.Section(bg, "s", 1, "Old."))
	other := must[*dsp.Handle[string]](t)(client.Section(bg, "t", 2, "T."))
	s.silentUpdates.Store(true)
	_, err := handle.Update(bg, "New.")
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	<-first.done // it may have happened there: the session is made again
	second := <-s.sessions
	waitFor(t, "the new session", func() bool { return client.Connected() && client.SessionID() == second.id })
	s.silentUpdates.Store(false)
	must[uint64](t)(handle.Update(bg, "New."))

	s.silentDisposals.Store(true)
	err = other.Dispose(bg)
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	<-second.done
	third := <-s.sessions
	waitFor(t, "the third session", func() bool { return client.Connected() && client.SessionID() == third.id })
}
