package dsp_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The local cache against a scripted sidecar whose change stream breaks when the
// test says, the Go twin of tests/client/test_local_cache_streams.py: while the
// stream is down, and after it resyncs, no kept answer is served.

// cacheable answers every Assemble with one section, rules, reading text,
// cacheable at revision; its change stream breaks on cut, and its
// resubscription waits for resume, then confirms it with resumed.
type cacheable struct {
	*script
	mu       sync.Mutex
	text     string
	revision uint64
	resumed  *pb.WatchSubscribed
	listed   atomic.Bool
	asked    atomic.Int32
	cut      chan struct{}
	resume   chan struct{}
}

func newCacheable() *cacheable {
	c := &cacheable{script: &script{}, text: "v1", revision: 10, cut: make(chan struct{}), resume: make(chan struct{}),
		resumed: &pb.WatchSubscribed{Revision: 10, Incarnation: "first"}}
	c.assemble = func(context.Context, *pb.AssembleRequest) (*pb.AssembleResponse, error) {
		c.asked.Add(1)
		c.mu.Lock()
		defer c.mu.Unlock()
		return &pb.AssembleResponse{Revision: c.revision, Cacheable: true, Assembly: &pb.PromptAssembly{
			Sections: []*pb.AssembledSection{{Name: "rules", Text: c.text}},
		}}, nil
	}
	c.watch = func(n int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		if n == 1 {
			if err := stream.Send(subscribed(10, "first")); err != nil {
				return err
			}
			select {
			case <-c.cut:
				return status.Error(codes.Unavailable, "cut")
			case <-stream.Context().Done():
				return nil
			}
		}
		select {
		case <-c.resume:
		case <-stream.Context().Done():
			return nil
		}
		c.mu.Lock()
		resumed := c.resumed
		c.mu.Unlock()
		if err := stream.Send(&pb.WatchChangesResponse{Incarnation: resumed.Incarnation,
			Kind: &pb.WatchChangesResponse_Subscribed{Subscribed: resumed}}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	c.list = func(_ *pb.ListRegistrationsRequest, stream pb.SystemPromptService_ListRegistrationsServer) error {
		c.mu.Lock()
		listing := &pb.ListRegistrationsResponse{Revision: c.resumed.Revision, Incarnation: c.resumed.Incarnation}
		c.mu.Unlock()
		defer c.listed.Store(true)
		return stream.Send(listing)
	}
	return c
}

// set makes the sidecar's answer from now on text at revision.
func (c *cacheable) set(text string, revision uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.text, c.revision = text, revision
}

func rules(t *testing.T, client *dsp.Client) string {
	t.Helper()
	return text(must[*dsp.Assembly](t)(client.Assemble(bg)), "rules")
}

// broken is a caching client that kept the scripted sidecar's v1, whose change
// stream then broke (its resubscription waits for resume).
func broken(t *testing.T) (*cacheable, *dsp.Client) {
	t.Helper()
	c := newCacheable()
	address := serveScript(t, c.script)
	client := must[*dsp.Client](t)(dsp.Connect(bg, address, dsp.WithCallTimeout(scriptedCallTimeout), dsp.WithLocalCache()))
	t.Cleanup(func() { client.Close() })
	rules(t, client)
	if rules(t, client) != "v1" || c.asked.Load() != 1 {
		t.Fatalf("the second assemble was not kept: %d asked", c.asked.Load())
	}
	close(c.cut)
	waitFor(t, "the stream's resubscription", func() bool { return c.watches.Load() == 2 })
	return c, client
}

// resyncedAt3 lets the stream resubscribe to another incarnation, whose
// revisions are below the kept answer's, and resync from its listing.
func resyncedAt3(t *testing.T, c *cacheable) {
	t.Helper()
	c.mu.Lock()
	c.resumed = &pb.WatchSubscribed{Revision: 3, Incarnation: "second", Resync: true}
	c.mu.Unlock()
	close(c.resume)
	waitFor(t, "the resync's listing", c.listed.Load)
}

func TestWhileTheChangeStreamIsDownNoKeptAnswerIsServed(t *testing.T) {
	c, client := broken(t)
	defer close(c.resume)
	c.set("v2", 11) // a change the broken stream does not bring
	if got := rules(t, client); got != "v2" {
		t.Fatalf("a broken stream's kept answer was served: %q", got)
	}
}

func TestAfterAResyncNoAnswerKeptBeforeItIsServed(t *testing.T) {
	c, client := broken(t)
	resyncedAt3(t, c)
	c.set("v2", 3)
	if got := rules(t, client); got != "v2" {
		t.Fatalf("an answer kept before the resync was served: %q", got)
	}
}

func TestAfterAResyncAnswersAreKeptAgain(t *testing.T) {
	c, client := broken(t)
	c.set("v1", 3)
	resyncedAt3(t, c)
	waitFor(t, "an answer kept at revision 3", func() bool {
		rules(t, client)
		before := c.asked.Load()
		rules(t, client)
		return c.asked.Load() == before
	})
}

func TestALocalCacheWhoseStreamCannotBeResumedIsOffAndSaysSo(t *testing.T) {
	c := newCacheable()
	c.watch = func(n int, _ *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		if n > 1 {
			return status.Error(codes.PermissionDenied, "no more watching")
		}
		if err := stream.Send(subscribed(10, "first")); err != nil {
			return err
		}
		<-c.cut
		return status.Error(codes.Unavailable, "cut")
	}
	log := &recorder{}
	client := must[*dsp.Client](t)(dsp.Connect(bg, serveScript(t, c.script), dsp.WithCallTimeout(scriptedCallTimeout),
		dsp.WithLocalCache(), dsp.WithLogger(log)))
	t.Cleanup(func() { client.Close() })
	rules(t, client)
	close(c.cut)
	log.wantSaid(t, "WARN dsp: local cache off: its change stream ended")
	before := c.asked.Load()
	rules(t, client)
	rules(t, client)
	if c.asked.Load() != before+2 {
		t.Fatalf("an answer was kept with the local cache off: %d calls", c.asked.Load()-before)
	}
}

func TestConnectWithALocalCacheFailsWhenItsChangeStreamFails(t *testing.T) {
	c := newCacheable()
	c.watch = func(int, *pb.WatchChangesRequest, pb.SystemPromptService_WatchChangesServer) error {
		return status.Error(codes.FailedPrecondition, "no watching")
	}
	_, err := dsp.Connect(bg, serveScript(t, c.script), dsp.WithCallTimeout(scriptedCallTimeout), dsp.WithLocalCache())
	wantError(t, err, codes.FailedPrecondition, dsp.ReasonUnknown)
	nothingLeft(t, c.script)
}

// refusing is a scripted sidecar that refuses the watch of every change, as for an
// agent listing its own scopes, and takes a watch of one scope's chain, counting them.
func refusing() (*cacheable, *atomic.Int32) {
	c, scoped := newCacheable(), &atomic.Int32{}
	c.watch = func(_ int, request *pb.WatchChangesRequest, stream pb.SystemPromptService_WatchChangesServer) error {
		filter := request.GetFilter()
		if filter.GetScope() == "" {
			return status.Error(codes.PermissionDenied, "scope: the credential may not read every scope")
		}
		if !filter.GetAncestors() {
			return status.Error(codes.InvalidArgument, "the cache watches a scope's whole chain")
		}
		scoped.Add(1)
		if err := stream.Send(subscribed(10, "first")); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	return c, scoped
}

// keptFor tells whether a second Assemble of scope is answered without a call.
func keptFor(t *testing.T, c *cacheable, client *dsp.Client, scope string) bool {
	t.Helper()
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope(scope)))
	before := c.asked.Load()
	must[*dsp.Assembly](t)(client.Assemble(bg, dsp.ForScope(scope)))
	return c.asked.Load() == before
}

func TestAWatchRefusedForEveryChangeWatchesEachScopeAssembledUpTo16(t *testing.T) {
	c, scoped := refusing()
	client := must[*dsp.Client](t)(dsp.Connect(bg, serveScript(t, c.script), dsp.WithCallTimeout(scriptedCallTimeout), dsp.WithLocalCache()))
	if keptFor(t, c, client, "") {
		t.Fatal("the global layer alone was kept without a stream covering it")
	}
	for number := 0; number < 16; number++ {
		scope := fmt.Sprint("scope-", number)
		waitFor(t, "a kept answer of "+scope, func() bool { return keptFor(t, c, client, scope) })
	}
	if keptFor(t, c, client, "the-17th") || keptFor(t, c, client, "the-17th") {
		t.Fatal("a 17th scope was kept")
	}
	if scoped.Load() != 16 {
		t.Fatalf("%d scopes watched, want 16", scoped.Load())
	}
	client.Close()
	nothingLeft(t, c.script)
}
