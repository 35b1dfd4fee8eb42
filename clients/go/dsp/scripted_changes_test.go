package dsp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Scripted sidecars that misbehave on change streams, prompt watches, updates and disposals.

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

// ejectedEvent is revision's disposal of name by the sidecar itself, for reason.
func ejectedEvent(revision uint64, name, reason string) *pb.WatchChangesResponse {
	return &pb.WatchChangesResponse{Incarnation: "i", Kind: &pb.WatchChangesResponse_Event{Event: &pb.ChangeEvent{
		Revision: revision, Kind: pb.ChangeKind_CHANGE_KIND_LISTENER, Action: pb.ChangeAction_CHANGE_ACTION_UNREGISTERED,
		Name: name, Reason: reason,
	}}}
}

func TestADisposalsReasonIsDeliveredAloneAndInABatch(t *testing.T) {
	s := watchScript(
		ejectedEvent(2, "alone", "ejected: alone"),
		batch(nil, changeEvent(3, "plain"), ejectedEvent(4, "batched", "ejected: batched")),
	)
	client := connectScripted(t, serveScript(t, s))
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(bg))
	defer changes.Close()
	var got []string
	for len(got) < 3 {
		event := nextEvent(t, changes)
		got = append(got, event.Name+": "+event.Reason)
	}
	equal(t, got, []string{"alone: ejected: alone", "plain: ", "batched: ejected: batched"})
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

func TestAPromptWatchTheSidecarNeverAnswersFailsWithinTheCallTimeout(t *testing.T) {
	s := &script{}
	client := connectScripted(t, serveScript(t, s))
	_, err := client.WatchPrompt(bg, "agent-1")
	wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
	client.Close()
	nothingLeft(t, s)
}

func TestAPromptStreamTheSidecarBreaksFailsAndIsNotWatchedAgain(t *testing.T) {
	s := &script{watchPrompt: func(_ int, request *pb.WatchPromptRequest, stream pb.SystemPromptService_WatchPromptServer) error {
		_ = stream.Send(&pb.WatchPromptResponse{Revision: 3, Incarnation: "i", Assembly: &pb.PromptAssembly{
			Sections: []*pb.AssembledSection{{Name: "rules", Text: request.GetScope()}},
		}})
		return status.Error(codes.Unavailable, "going away")
	}}
	client := connectScripted(t, serveScript(t, s))
	prompts := must[*dsp.PromptStream](t)(client.WatchPrompt(bg, "agent-1"))
	first := nextPrompt(t, prompts)
	if first.Revision != 3 || text(first.Assembly, "rules") != "agent-1" || first.Report != nil || first.Prompt != nil {
		t.Fatalf("the first prompt: %+v", first)
	}
	_, err := prompts.Next(within(t, 5*time.Second))
	if failed := failure(t, err); failed.Code != codes.Unavailable || errors.Is(err, io.EOF) {
		t.Fatalf("the broken stream: %+v", failed)
	}
	if _, err := prompts.Next(within(t, 5*time.Second)); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the break: %v", err)
	}
	if n := s.prompts.Load(); n != 1 {
		t.Fatalf("%d prompt watches, want 1: it does not resume by itself", n)
	}
	client.Close()
	nothingLeft(t, s)
}

func TestACallCutShortByTheCallersDeadlineSaysSoNotTheCallTimeout(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 8)}
	s.register = func(ctx context.Context, request *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		if request.GetName() == "silent" {
			<-ctx.Done() // an answer now could still reach the client within its deadline
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return &pb.RegisterSectionResponse{RegistrationId: "r-" + request.GetName()}, nil
	}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	handle := must[*dsp.Handle[string]](t)(client.Section(bg, "s", 1, "Old."))
	s.silentUpdates.Store(true)
	s.silentDisposals.Store(true)
	for what, call := range map[string]func(context.Context) error{
		"Update":         func(ctx context.Context) error { _, err := handle.Update(ctx, "New."); return err },
		"a registration": func(ctx context.Context) error { _, err := client.Section(ctx, "silent", 2, "S."); return err },
	} {
		err := call(within(t, scriptedCallTimeout/5))
		failed := wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
		want := "sidecar unavailable: no answer to " + what + " within the caller's deadline ("
		if !strings.HasPrefix(failed.Message, want) || strings.Contains(failed.Message, scriptedCallTimeout.String()) {
			t.Fatalf("%s cut short by its caller: %q", what, failed.Message)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s cut short by its caller's deadline is not context.DeadlineExceeded", what)
		}
		<-session.done // it may have happened there: the session is made again
		session = <-s.sessions
		waitFor(t, "the new session", func() bool { return client.Connected() && client.SessionID() == session.id })
		handle = must[*dsp.Handle[string]](t)(client.Section(bg, "s", 1, "Old."))
	}
	err := handle.Dispose(within(t, scriptedCallTimeout/5)) // a disposal runs to its end whatever its ctx
	if failed := failure(t, err); failed.Message != "sidecar unavailable: no answer to Dispose within 500ms" {
		t.Fatalf("a Dispose its caller's deadline would cut short names the call timeout: %q", failed.Message)
	}
	<-session.done
	session = <-s.sessions
	waitFor(t, "the new session", func() bool { return client.Connected() && client.SessionID() == session.id })
	handle = must[*dsp.Handle[string]](t)(client.Section(bg, "s", 1, "Old."))
	_, err = handle.Update(within(t, 10*time.Second), "New.")
	if failed := failure(t, err); failed.Message != "sidecar unavailable: no answer to Update within 500ms" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call its caller gives longer names the call timeout, a deadline: %q", failed.Message)
	}
}

// watches are each watch call, by what its no-answer error names.
func watches(client *dsp.Client) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"watching changes":    func(ctx context.Context) error { _, err := client.WatchChanges(ctx); return err },
		"watching the prompt": func(ctx context.Context) error { _, err := client.WatchPrompt(ctx, "agent-1"); return err },
	}
}

// neverConfirmed is a sidecar that takes watches and never confirms them;
// started has one value per watch it took.
func neverConfirmed() (s *script, started chan struct{}) {
	started = make(chan struct{}, 4)
	never := func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		return nil
	}
	return &script{
		watch: func(_ int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
			return never(stream.Context())
		},
		watchPrompt: func(_ int, _ *pb.WatchPromptRequest, stream pb.SystemPromptService_WatchPromptServer) error {
			return never(stream.Context())
		},
	}, started
}

func TestAWatchEndsAtItsCallersDeadlineNamingIt(t *testing.T) {
	s, _ := neverConfirmed()
	client := connectScripted(t, serveScript(t, s))
	for what, watch := range watches(client) {
		err := watch(within(t, scriptedCallTimeout/5))
		failed := wantError(t, err, codes.Unavailable, dsp.ReasonSidecarUnavailable)
		want := "sidecar unavailable: no answer to " + what + " within the caller's deadline ("
		if !strings.HasPrefix(failed.Message, want) || strings.Contains(failed.Message, scriptedCallTimeout.String()) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s cut short by its caller: %q", what, failed.Message)
		}
	}
	client.Close()
	nothingLeft(t, s)
}

func TestAWatchWhoseCtxIsCancelledWhileWaitingFailsCanceled(t *testing.T) {
	s, started := neverConfirmed()
	client := connectScripted(t, serveScript(t, s))
	for what, watch := range watches(client) {
		ctx, cancel := context.WithCancel(bg)
		go func() {
			<-started
			cancel()
		}()
		err := watch(ctx)
		if failed := failure(t, err); failed.Code != codes.Canceled || !errors.Is(err, context.Canceled) {
			t.Fatalf("%s cancelled by its caller: %+v", what, failed)
		}
	}
	client.Close()
	nothingLeft(t, s)
}

func TestAWatchOutlivesTheCtxItWasStartedWith(t *testing.T) {
	later := make(chan struct{})
	s := &script{
		watch: func(_ int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
			_ = stream.Send(subscribed(1, "i"))
			<-later
			_ = stream.Send(changeEvent(2, "a"))
			<-stream.Context().Done()
			return nil
		},
		watchPrompt: func(_ int, _ *pb.WatchPromptRequest, stream pb.SystemPromptService_WatchPromptServer) error {
			_ = stream.Send(&pb.WatchPromptResponse{Revision: 1, Incarnation: "i"})
			<-later
			_ = stream.Send(&pb.WatchPromptResponse{Revision: 2, Incarnation: "i"})
			<-stream.Context().Done()
			return nil
		},
	}
	client := connectScripted(t, serveScript(t, s))
	ctx, cancel := context.WithCancel(bg)
	changes := must[*dsp.ChangeStream](t)(client.WatchChanges(ctx))
	prompts := must[*dsp.PromptStream](t)(client.WatchPrompt(ctx, "agent-1"))
	nextPrompt(t, prompts)
	cancel()
	time.Sleep(100 * time.Millisecond) // time for a stream tied to ctx to end
	close(later)
	change := must[dsp.Change](t)(changes.Next(within(t, 5*time.Second)))
	if event, ok := change.(dsp.ChangeEvent); !ok || event.Revision != 2 {
		t.Fatalf("the change after the watch's ctx ended: %+v", change)
	}
	if prompt := nextPrompt(t, prompts); prompt.Revision != 2 {
		t.Fatalf("the prompt after the watch's ctx ended: %+v", prompt)
	}
	if n, m := s.watches.Load(), s.prompts.Load(); n != 1 || m != 1 {
		t.Fatalf("%d change watches and %d prompt watches, want 1 each: the streams ended with their ctx", n, m)
	}
	client.Close()
	nothingLeft(t, s)
}
