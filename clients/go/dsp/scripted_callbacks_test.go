package dsp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// Scripted sidecars that misbehave on the session and listener streams.

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

func TestInstallingAListenerEndsAtItsCallersDeadlineOrCancellation(t *testing.T) {
	started, ended := make(chan struct{}, 2), make(chan struct{}, 2)
	s := &script{sessions: make(chan *scriptedSession, 4), listen: func(_ *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		started <- struct{}{}
		<-stream.Context().Done() // never confirmed
		ended <- struct{}{}
		return nil
	}}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	_, err := client.OnAssemble(within(t, scriptedCallTimeout/5), passThrough)
	failed := wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	want := "sidecar unavailable: no answer to installing a listener within the caller's deadline ("
	if !strings.HasPrefix(failed.Message, want) || strings.Contains(failed.Message, scriptedCallTimeout.String()) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an install cut short by its caller: %q", failed.Message)
	}
	<-started
	<-ended        // the unconfirmed stream is not kept
	<-session.done // it may have been installed there: the session is made again
	session = <-s.sessions
	waitFor(t, "the new session", func() bool { return client.Connected() && client.SessionID() == session.id })

	ctx, cancel := context.WithCancel(bg)
	go func() {
		<-started
		cancel()
	}()
	_, err = client.OnAssemble(ctx, passThrough)
	if wantError(t, err, codes.Canceled, dsp.ReasonUnknown); !errors.Is(err, context.Canceled) {
		t.Fatalf("an install cancelled by its caller is not context.Canceled: %v", err)
	}
	<-ended
	client.Close()
	nothingLeft(t, s)
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
	offered := make(chan []string, 1)
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		offered <- start.GetFeatures()
		check(t, stream.Send(registeredWith("tool-slots"))) // a sidecar without part-slots
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
	equal(t, <-offered, []string{"tool-slots", "part-slots", "callback-cache"}) // part-slots offered, not confirmed
	next := (<-replies).GetNext()
	if next == nil || len(next.GetAssembly().GetTools()) != 0 || fmt.Sprint(next.GetToolSlots()) != "[0 1]" || next.GetSlots() != nil {
		t.Fatalf("unchanged tools go to next() as tool slots alone: %v", next)
	}
	result := (<-replies).GetResult()
	if result == nil || fmt.Sprint(result.GetToolSlots()) != "[1 -1 0]" || result.GetAssembly().GetTools()[0].GetName() != "new" ||
		result.GetSlots() != nil {
		t.Fatalf("the result names the invocation's tools by tool slot: %v", result)
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
