package dsp_test

import (
	"context"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// A scripted sidecar ejects callbacks when the test says so, so that the
// backoff and a disposal during it can be watched.

// registering is one RegisterSection the scripted sidecar answered.
type registering struct {
	request *pb.RegisterSectionRequest
	at      time.Time
}

// clockID is the id of every registration: the test may eject one as soon as it
// arrives, before the client has read the answer that names it.
const clockID = "clock-registration"

func recordRegistrations(s *script) chan registering {
	made := make(chan registering, 10)
	s.register = func(_ context.Context, request *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		made <- registering{request, time.Now()}
		return &pb.RegisterSectionResponse{RegistrationId: clockID}, nil
	}
	return made
}

func nextRegistration(t *testing.T, made chan registering) registering {
	t.Helper()
	select {
	case r := <-made:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no registration came")
		return registering{}
	}
}

func ejectedMessage(id string) *pb.OpenSessionResponse {
	return &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Ejected{Ejected: &pb.CallbackEjected{
		RegistrationId: id, Reason: "PROVIDER_TIMEOUT", Message: `section provider "clock" did not answer within 0.5s`,
	}}}
}

// ejectAndWait ejects id on session and returns once the client has read it: a
// ProvideRequest sent after it is answered only after the ejection was handled.
func ejectAndWait(t *testing.T, session *scriptedSession, id, key string) time.Time {
	t.Helper()
	at := time.Now()
	session.send(t, ejectedMessage(id))
	session.send(t, provide(uint64(at.UnixNano()), "", key))
	if session.provided(t, 5*time.Second) == nil {
		t.Fatal("the client did not answer after the ejection")
	}
	return at
}

func listenerEjected() *pb.ListenResponse {
	return &pb.ListenResponse{Kind: &pb.ListenResponse_Ejected{Ejected: &pb.CallbackEjected{
		RegistrationId: "listener", Reason: "LISTENER_TIMEOUT", Message: `listener "sign" did not answer within 0.5s`,
	}}}
}

func clock(context.Context, dsp.AssembleContext) (string, error) { return "It is noon.", nil }

func TestAnEjectedProviderIsMadeAgainAfterABackoffThatDoubles(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	made := recordRegistrations(s)
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "clock", 1, clock))
	first := nextRegistration(t, made)
	key := first.request.GetDynamic().GetProviderKey()

	ejected := ejectAndWait(t, session, clockID, key)
	second := nextRegistration(t, made)
	if waited := second.at.Sub(ejected); waited < time.Second {
		t.Fatalf("made again after %s, before the first backoff of 1 s", waited)
	}
	if second.request.GetSessionId() != session.id || second.request.GetDynamic().GetProviderKey() != key {
		t.Fatalf("made again as %v, want the same provider on session %s", second.request, session.id)
	}
	ejected = ejectAndWait(t, session, clockID, key)
	third := nextRegistration(t, made)
	if waited := third.at.Sub(ejected); waited < 2*time.Second {
		t.Fatalf("made again after %s, before the doubled backoff of 2 s", waited)
	}
	if len(s.sessions) != 0 {
		t.Fatal("a new session was opened: only the provider should be made again")
	}
}

func TestDisposingAnEjectedProviderDuringItsBackoffCancelsItsReinstall(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	made := recordRegistrations(s)
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	handle := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "clock", 1, clock))
	first := nextRegistration(t, made)
	ejectAndWait(t, session, clockID, first.request.GetDynamic().GetProviderKey())
	check(t, handle.Dispose(bg))
	select {
	case again := <-made:
		t.Fatalf("a disposed provider was registered again: %v", again.request)
	case <-time.After(2 * time.Second): // twice the backoff
	}
}

func TestDisposingAnEjectedListenerDuringItsBackoffCancelsItsReinstall(t *testing.T) {
	ended := make(chan struct{})
	s := &script{}
	s.listen = func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		if s.listens.Load() > 1 {
			return drain(stream)
		}
		check(t, stream.Send(listenerEjected()))
		close(ended)
		return nil // the sidecar ends an ejected listener's stream with OK
	}
	client := connectScripted(t, serveScript(t, s))
	handle := must[*dsp.Registration](t)(client.OnAssemble(bg, passThrough))
	<-ended
	time.Sleep(200 * time.Millisecond) // for the client to read the stream's end
	check(t, handle.Dispose(bg))
	time.Sleep(2 * time.Second) // twice the backoff
	if n := s.listens.Load(); n != 1 {
		t.Fatalf("a disposed listener was installed again (%d listen streams)", n)
	}
}

func TestAnEjectedListenerIsInstalledAgainOnANewStreamOfItsSession(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	s.listen = func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		if s.listens.Load() > 1 {
			return drain(stream)
		}
		check(t, stream.Send(listenerEjected()))
		return nil
	}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	must[*dsp.Registration](t)(client.OnAssemble(bg, passThrough))
	waitFor(t, "the listener installed again", func() bool { return s.listens.Load() == 2 })
	if len(s.sessions) != 0 || client.SessionID() != session.id {
		t.Fatal("a new session was opened: only the listener should be installed again")
	}
}
