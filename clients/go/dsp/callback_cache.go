// Cacheable callbacks: WithCache, Registration.Invalidate, and the invalidations
// awaiting the sidecar's confirmation on a stream.

package dsp

import (
	"context"
	"sync"
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// featureCallbackCache, offered on the session and on every listener stream:
// this client sends CacheInvalidate and reads CacheInvalidated.
const featureCallbackCache = "callback-cache"

// Cache is what a provider's answer (or a listener's result, for its input)
// depends on, so that the sidecar may reuse it instead of asking
// (docs/protocol.md, "Cacheable callbacks"). Any registry change (a
// registration, update or disposal anywhere, a listener added or removed, a
// session's end) drops every cached answer, as does a sidecar restart;
// Registration.Invalidate drops the callback's own. Without WithCache a
// callback is asked at every assembly.
type Cache struct {
	// Fields: the answer depends on the assemble context too (its scope and
	// fields), so one is kept per context; false: one answer for every context.
	Fields bool
	// TTL bounds how long an answer is reused, from when it was given; 0: for as
	// long as the registry's revision lasts. It must not be negative.
	TTL time.Duration
}

var (
	// CacheRevision is an answer that depends on nothing but the registry's revision.
	CacheRevision = Cache{}
	// CacheFields is an answer that depends on the assemble context too.
	CacheFields = Cache{Fields: true}
)

// CacheTTL is an answer reused for at most ttl (and, with fields, kept per
// assemble context); ttl must be positive.
func CacheTTL(ttl time.Duration, fields bool) Cache { return Cache{Fields: fields, TTL: ttl} }

// WithCache lets the sidecar reuse the provider's answer, or the listener's
// result for the same input assembly, as policy says, instead of asking each
// time; Registration.Invalidate drops what it keeps. A static value refuses it
// (INVALID_VALUE), as it is never asked for.
func WithCache(policy Cache) CallbackOption {
	return CallbackOption{func(a *asked) { a.cache = &policy }}
}

// cachePolicy is the callback's policy as sent, nil when WithCache was not given.
func (a asked) cachePolicy() (*pb.CachePolicy, error) {
	if a.cache == nil {
		return nil, nil
	}
	if a.cache.TTL < 0 {
		return nil, invalid("a time to live must be a positive duration, not %s", a.cache.TTL)
	}
	depends := pb.CacheDependency_CACHE_DEPENDENCY_REVISION
	if a.cache.Fields {
		depends = pb.CacheDependency_CACHE_DEPENDENCY_CONTEXT
	}
	return &pb.CachePolicy{DependsOn: depends, TtlS: a.cache.TTL.Seconds()}, nil
}

// Invalidate drops the sidecar's cached answers of this registration's
// provider, or results of its listener (one made WithCache): assemblies that
// start once it returns ask the callback again. It returns once the sidecar
// confirms, within the call timeout (else UNAVAILABLE, SIDECAR_UNAVAILABLE)
// and ctx. A registration without a callback, a disposed one, a sidecar
// without the feature and a connection being re-established have nothing
// cached to drop: then it returns nil at once (a reconnect makes every
// registration again, which drops every cached answer).
func (d *Registration) Invalidate(ctx context.Context) error {
	c, r := d.c, d.r
	c.mu.Lock()
	held := false
	for _, other := range c.regs {
		held = held || other == r
	}
	if c.closed || !c.connected || !held {
		c.mu.Unlock()
		return nil
	}
	s, stream := c.session, r.stream
	c.mu.Unlock()
	callCtx, cancel := bounded(ctx, c.callTimeout)
	defer cancel()
	switch {
	case stream != nil:
		return stream.invalidate(callCtx)
	case r.providerKey != "":
		return s.invalidate(callCtx, r.providerKey)
	}
	return nil
}

// invalidate drops the sidecar's cached answers of providers keys on this session.
func (s *session) invalidate(ctx context.Context, keys ...string) error {
	if !s.callbackCache {
		return nil
	}
	return s.invalidations.await(ctx, func(id uint64) {
		s.send(&pb.OpenSessionRequest{Kind: &pb.OpenSessionRequest_Invalidate{Invalidate: &pb.CacheInvalidate{
			InvalidateId: id, ProviderKeys: keys,
		}}})
	})
}

// invalidate drops the sidecar's cached results of this stream's listener.
func (s *listenerStream) invalidate(ctx context.Context) error {
	if !s.callbackCache {
		return nil
	}
	return s.invalidations.await(ctx, func(id uint64) {
		s.send(&pb.ListenRequest{Kind: &pb.ListenRequest_Invalidate{Invalidate: &pb.CacheInvalidate{InvalidateId: id}}})
	})
}

// invalidations are the CacheInvalidates sent on one stream that the sidecar
// has not confirmed yet.
type invalidations struct {
	mu      sync.Mutex
	last    uint64
	waiting map[uint64]chan struct{}
	over    bool // the stream ended: what it registered is disposed, nothing of it cached
}

// await sends one invalidation (send, with its id) and waits until the sidecar
// confirms it or the stream ends; past ctx it is no answer.
func (v *invalidations) await(ctx context.Context, send func(id uint64)) error {
	v.mu.Lock()
	if v.over {
		v.mu.Unlock()
		return nil
	}
	if v.waiting == nil {
		v.waiting = map[uint64]chan struct{}{}
	}
	v.last++
	id, done := v.last, make(chan struct{})
	v.waiting[id] = done
	v.mu.Unlock()
	defer func() {
		v.mu.Lock()
		delete(v.waiting, id)
		v.mu.Unlock()
	}()
	send(id)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return answerError(ctx, ctx.Err(), "a cache invalidation")
	}
}

// confirmed hears the sidecar's CacheInvalidated for id.
func (v *invalidations) confirmed(id uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if done := v.waiting[id]; done != nil {
		close(done)
		delete(v.waiting, id)
	}
}

// release hears that the stream ended: every invalidation waiting is done.
func (v *invalidations) release() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.over = true
	for id, done := range v.waiting {
		close(done)
		delete(v.waiting, id)
	}
}
