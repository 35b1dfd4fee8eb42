package dsp_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
)

// Cacheable callbacks on the wire, against a scripted sidecar: the policy each
// registration sends, the "callback-cache" feature offered and honoured, and
// Invalidate waiting for the sidecar's CacheInvalidated (docs/protocol.md,
// "Cacheable callbacks").

// openedWith opens sessions confirming features.
func openedWith(features ...string) func(int) *pb.OpenSessionResponse {
	return func(n int) *pb.OpenSessionResponse {
		return &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Opened{Opened: &pb.SessionOpened{
			SessionId: fmt.Sprintf("session-%d", n), Features: features,
		}}}
	}
}

// cachingScripted is a client of a scripted sidecar whose sessions confirm features, and its session.
func cachingScripted(t *testing.T, features ...string) (*dsp.Client, *scriptedSession) {
	s := &script{sessions: make(chan *scriptedSession, 4), opened: openedWith(features...)}
	client := connectScripted(t, serveScript(t, s))
	return client, <-s.sessions
}

func cachedText(context.Context, dsp.AssembleContext) (string, error) { return "x", nil }

// invalidateOn is the next CacheInvalidate the client sent on session.
func invalidateOn(t *testing.T, session *scriptedSession) *pb.CacheInvalidate {
	t.Helper()
	select {
	case m := <-session.received:
		if m.GetInvalidate() == nil {
			t.Fatalf("want a CacheInvalidate, got %v", m)
		}
		return m.GetInvalidate()
	case <-time.After(5 * time.Second):
		t.Fatal("no CacheInvalidate came")
	}
	return nil
}

func TestTheSessionOffersCallbackCacheAndEachPolicyIsSentAsDeclared(t *testing.T) {
	s := &script{sessions: make(chan *scriptedSession, 4)}
	var sent []*pb.RegisterSectionRequest
	s.register = func(_ context.Context, request *pb.RegisterSectionRequest) (*pb.RegisterSectionResponse, error) {
		sent = append(sent, request)
		return &pb.RegisterSectionResponse{RegistrationId: s.id("registration-")}, nil
	}
	client := connectScripted(t, serveScript(t, s))
	session := <-s.sessions
	if fmt.Sprint(session.start.GetFeatures()) != "[callback-cache each-answer]" {
		t.Fatalf("the session start offers %v", session.start.GetFeatures())
	}
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "plain", 1, cachedText))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "revision", 1, cachedText, dsp.WithCache(dsp.CacheRevision)))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "fields", 1, cachedText, dsp.WithCache(dsp.CacheFields)))
	must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "ttl", 1, cachedText, dsp.WithCache(dsp.CacheTTL(1500*time.Millisecond, true))))
	policies := []string{}
	for _, request := range sent {
		cache := request.GetDynamic().GetCache()
		policies = append(policies, fmt.Sprintf("%s:%v/%g", request.GetName(), cache.GetDependsOn(), cache.GetTtlS()))
	}
	want := "[plain:CACHE_DEPENDENCY_UNSPECIFIED/0 revision:CACHE_DEPENDENCY_REVISION/0 " +
		"fields:CACHE_DEPENDENCY_CONTEXT/0 ttl:CACHE_DEPENDENCY_CONTEXT/1.5]"
	if fmt.Sprint(policies) != want || sent[0].GetDynamic().Cache != nil {
		t.Fatalf("the policies sent: %v", policies)
	}
}

func TestInvalidateReturnsOnceTheSidecarConfirmsItsOwnInvalidation(t *testing.T) {
	client, session := cachingScripted(t, "callback-cache")
	handle := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, cachedText, dsp.WithCache(dsp.CacheRevision)))
	done := make(chan error, 1)
	go func() { done <- handle.Invalidate(bg) }()
	invalidate := invalidateOn(t, session)
	if fmt.Sprint(invalidate.GetProviderKeys()) != "[p1]" {
		t.Fatalf("the invalidation names %v", invalidate.GetProviderKeys())
	}
	confirm := func(id uint64) {
		session.send(t, &pb.OpenSessionResponse{Kind: &pb.OpenSessionResponse_Invalidated{
			Invalidated: &pb.CacheInvalidated{InvalidateId: id},
		}})
	}
	confirm(invalidate.GetInvalidateId() + 1) // another invalidation's: not this one's
	select {
	case err := <-done:
		t.Fatalf("Invalidate returned before its confirmation: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	confirm(invalidate.GetInvalidateId())
	returned(t, done, "once confirmed")
}

// returned fails unless the invalidation waiting on done returns nil soon.
func returned(t *testing.T, done <-chan error, when string) {
	t.Helper()
	select {
	case err := <-done:
		check(t, err)
	case <-time.After(5 * time.Second):
		t.Fatalf("Invalidate did not return %s", when)
	}
}

func TestAnInvalidationTheSidecarNeverConfirmsFailsWithinTheCallTimeout(t *testing.T) {
	client, _ := cachingScripted(t, "callback-cache")
	handle := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, cachedText, dsp.WithCache(dsp.CacheRevision)))
	failed := wantError(t, handle.Invalidate(bg), codes.Unavailable, dsp.ReasonSidecarUnavailable)
	if failed.Message != "sidecar unavailable: no answer to a cache invalidation within 500ms" {
		t.Fatalf("the failure: %q", failed.Message)
	}
}

func TestAnInvalidationWhoseSessionEndsIsDone(t *testing.T) {
	client, session := cachingScripted(t, "callback-cache")
	handle := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, cachedText, dsp.WithCache(dsp.CacheRevision)))
	done := make(chan error, 1)
	go func() { done <- handle.Invalidate(within(t, 10*time.Second)) }()
	invalidateOn(t, session)
	session.ending <- nil // the session is over: what it registered is cached no more
	returned(t, done, "once its session ended")
}

func TestASidecarWithoutTheFeatureIsSentNoInvalidation(t *testing.T) {
	client, session := cachingScripted(t) // confirms no feature
	handle := must[*dsp.Handle[string]](t)(client.SectionFunc(bg, "dynamic", 1, cachedText, dsp.WithCache(dsp.CacheRevision)))
	check(t, handle.Invalidate(bg))
	select {
	case m := <-session.received:
		t.Fatalf("the client sent %v", m)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestAListenerOffersCallbackCacheAndInvalidatesOnItsStream(t *testing.T) {
	starts := make(chan *pb.ListenStart, 1)
	invalidates := make(chan *pb.CacheInvalidate, 1)
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		starts <- start
		if err := stream.Send(registered(start)); err != nil {
			return err
		}
		for {
			m, err := stream.Recv()
			if err != nil {
				return nil
			}
			if invalidate := m.GetInvalidate(); invalidate != nil {
				invalidates <- invalidate
				_ = stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_Invalidated{
					Invalidated: &pb.CacheInvalidated{InvalidateId: invalidate.GetInvalidateId()},
				}})
			}
		}
	}}
	client := connectScripted(t, serveScript(t, s))
	listener := must[*dsp.Registration](t)(client.OnAssemble(bg, passThrough, dsp.WithCache(dsp.CacheFields)))
	start := <-starts
	if !strings.Contains(fmt.Sprint(start.GetFeatures()), "callback-cache") || start.GetCache().GetDependsOn() != pb.CacheDependency_CACHE_DEPENDENCY_CONTEXT {
		t.Fatalf("the listener's start: %v", start)
	}
	check(t, listener.Invalidate(bg))
	select {
	case invalidate := <-invalidates:
		if len(invalidate.GetProviderKeys()) != 0 {
			t.Fatalf("a listener's invalidation: %v", invalidate)
		}
	default:
		t.Fatal("Invalidate returned without a CacheInvalidate sent")
	}
}
