// The connection: one session at a time, reconnecting, the registrations replayed in order.

package dsp

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// The connection: one channel, one session at a time, and reconnecting when a
// session is lost. Every registration is kept, in the order it was made, as
// what makes it; when the session ends without the client ending it (the
// sidecar restarted, the network dropped, a listener stream or a call went
// unanswered), a new session is opened with backoff and every registration is
// made again in that order, so assemblies after the restart equal those before.
// Handles point at registrations, so they keep working across restarts.

const (
	// DefaultCallTimeout bounds what the sidecar answers at once: opening a
	// session, a listener or a change stream, a registration, a disposal.
	DefaultCallTimeout = 10 * time.Second
	firstBackoff       = 50 * time.Millisecond
	maxBackoff         = 2 * time.Second
	endWait            = 5 * time.Second // how long ending a stream waits for the sidecar's side
)

// registration is one registration this client owns, and how to make it (again).
type registration struct {
	scope       *registration
	providerKey string
	// make registers on sessionID (in scopeID's layer); it returns the new id and,
	// for a listener, the stream that serves it.
	make func(ctx context.Context, sessionID, scopeID string) (string, *listenerStream, error)

	// revision is the registry's after the last make (0: not said), read by the
	// make's caller: read-your-writes for the local cache.
	revision uint64

	// Guarded by conn.mu.
	id     string
	stream *listenerStream
	// The sidecar ejected it (ejection.go): how often in a row, when last, and
	// the re-install waiting for its backoff.
	ejections   int
	lastEjected time.Time
	reinstall   *reinstallWait
}

type conn struct {
	cc          *grpc.ClientConn
	rpc         pb.SystemPromptServiceClient
	clientName  string
	callTimeout time.Duration
	providers   *providers
	log         Logger      // WithLogger's: what the client does on its own
	local       *localCache // WithLocalCache's; set before Connect returns

	// ops serialises registrations, disposals, updates and replays, so that each
	// of them sees one session from start to end.
	ops sync.Mutex

	mu           sync.Mutex
	regs         []*registration
	session      *session
	connected    bool
	up           chan struct{} // closed once connected; a new one while down
	closed       bool
	reconnecting bool
	closing      chan struct{}
	streams      map[*stopper]struct{} // watches, closed with the client
	background   sync.WaitGroup        // the reconnect goroutine and the re-installs of ejected callbacks
}

func newConn(cc *grpc.ClientConn, clientName string, callTimeout time.Duration) *conn {
	return &conn{
		cc:          cc,
		rpc:         pb.NewSystemPromptServiceClient(cc),
		clientName:  clientName,
		callTimeout: callTimeout,
		providers:   newProviders(),
		log:         quiet{},
		up:          make(chan struct{}),
		closing:     make(chan struct{}),
		streams:     map[*stopper]struct{}{},
	}
}

// open opens the first session, confirmed within timeout.
func (c *conn) open(timeout time.Duration) error {
	if err := c.startSession(timeout); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session.isEnded() {
		return newError(codes.Unavailable, ReasonSidecarUnavailable, "sidecar unavailable: the session ended as it opened")
	}
	c.setConnected()
	return nil
}

// openWhenReady retries open until the sidecar serves, timeout passes or ctx ends.
func (c *conn) openWhenReady(ctx context.Context, address string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		attempt := time.Until(deadline)
		if bound, ok := ctx.Deadline(); ok {
			attempt = shorter(attempt, time.Until(bound))
		}
		err := c.open(clamp(attempt, time.Millisecond, c.callTimeout))
		if err == nil {
			return nil
		}
		var failure *Error
		if ctx.Err() != nil {
			return fromRPC(ctx.Err())
		}
		if !errors.As(err, &failure) || failure.Code != codes.Unavailable {
			return err
		}
		c.log.Debug("dsp: waiting for the sidecar", "address", address, "error", failure.Message)
		if time.Now().After(deadline) {
			return notReady(address, timeout)
		}
		select {
		case <-ctx.Done():
			return fromRPC(ctx.Err())
		case <-time.After(clamp(time.Until(deadline), time.Millisecond, 200*time.Millisecond)):
		}
	}
}

func notReady(address string, timeout time.Duration) *Error {
	return newError(codes.Unavailable, ReasonSidecarUnavailable,
		"sidecar unavailable: no session with %s within %s", address, timeout)
}

// setConnected marks the connection up; c.mu is held.
func (c *conn) setConnected() {
	c.connected = true
	c.reconnecting = false
	close(c.up)
}

// startSession opens a session and replays every registration on it; a replay
// that fails ends its session, so no orphan keeps a registration live.
func (c *conn) startSession(timeout time.Duration) error {
	s, err := openSession(c, timeout)
	if err != nil {
		return err
	}
	c.log.Debug("dsp: session opened", "session", s.id, "sidecar", s.sidecarVersion)
	c.ops.Lock()
	c.mu.Lock()
	c.session = s
	c.mu.Unlock()
	err = c.replay(s.id)
	c.ops.Unlock()
	if err != nil {
		s.end()
	}
	return err
}

// replay makes every registration again on sessionID, in the original order; c.ops is held.
func (c *conn) replay(sessionID string) error {
	c.mu.Lock()
	regs := append([]*registration(nil), c.regs...)
	for _, r := range regs {
		if r.stream != nil {
			r.stream.close() // a lost session's listener streams went with it
			r.stream = nil
		}
	}
	c.mu.Unlock()
	for _, r := range regs {
		ctx, cancel := bounded(context.Background(), c.callTimeout)
		err := c.make(ctx, r, sessionID)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// make makes r on sessionID and records its new id.
func (c *conn) make(ctx context.Context, r *registration, sessionID string) error {
	c.mu.Lock()
	scopeID := ""
	if r.scope != nil {
		scopeID = r.scope.id
	}
	c.mu.Unlock()
	id, stream, err := r.make(ctx, sessionID, scopeID)
	if err != nil {
		return err
	}
	c.mu.Lock()
	r.id, r.stream = id, stream
	c.mu.Unlock()
	return nil
}

// lost hears that s ended without this client ending it.
func (c *conn) lost(s *session) {
	c.mu.Lock()
	current := c.session == s && !c.closed
	c.mu.Unlock()
	if current {
		c.log.Warn("dsp: the session ended; reconnecting", "session", s.id)
		c.startOver(nil)
	}
}

// restart ends the current session and replays on a new one: the sidecar and
// this client may disagree on what is registered (a call went unanswered, a
// listener stream was dropped), and a new session makes this client's view the truth.
func (c *conn) restart() {
	c.mu.Lock()
	s := c.session
	c.mu.Unlock()
	if s != nil {
		c.log.Warn("dsp: ending the session to make every registration again on a new one", "session", s.id)
	}
	c.startOver(s)
}

func (c *conn) startOver(ending *session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.reconnecting || !c.connected {
		return // closing, already reconnecting, or still connecting for the first time
	}
	c.reconnecting = true
	c.connected = false
	c.up = make(chan struct{})
	c.background.Add(1)
	go c.reconnect(ending)
}

func (c *conn) reconnect(ending *session) {
	defer c.background.Done()
	if ending != nil {
		ending.end() // the sidecar disposes all of it, whatever it kept
	}
	delay := firstBackoff
	for {
		select {
		case <-c.closing:
			return
		case <-time.After(delay):
		}
		delay = shorter(2*delay, maxBackoff)
		if err := c.startSession(c.callTimeout); err != nil {
			c.log.Info("dsp: sidecar unavailable, retrying", "retry_in", delay, "error", err.Error())
			continue // still down, or the replay failed (its session is ended): try again
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return // close ends the session
		}
		if c.session.isEnded() {
			c.mu.Unlock()
			c.log.Info("dsp: the session ended during its replay, retrying", "retry_in", delay)
			continue // it ended during its replay: its registrations went with it
		}
		c.setConnected()
		session, replayed := c.session.id, len(c.regs)
		c.mu.Unlock()
		c.log.Info("dsp: reconnected as a new session", "session", session, "replayed", replayed)
		return
	}
}

// close ends the session: the sidecar disposes everything it registered.
func (c *conn) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.connected = false
	close(c.closing)
	for _, r := range c.regs {
		c.cancelReinstall(r) // before the wait below: a backoff is up to 30 s
	}
	streams := make([]*stopper, 0, len(c.streams))
	for s := range c.streams {
		streams = append(streams, s)
	}
	c.mu.Unlock()
	for _, s := range streams {
		s.stop()
	}
	c.background.Wait()
	c.mu.Lock()
	for _, r := range c.regs {
		if r.stream != nil {
			r.stream.close()
		}
	}
	s := c.session
	c.mu.Unlock()
	if s != nil {
		s.end()
	}
	c.cc.Close()
}

// wait waits for a reconnect when the connection is down and ctx has a
// deadline; without one, calls fail fast while the connection is down.
func (c *conn) wait(ctx context.Context) {
	c.mu.Lock()
	up, connected, closed := c.up, c.connected, c.closed
	c.mu.Unlock()
	if _, bounded := ctx.Deadline(); connected || closed || !bounded {
		return
	}
	select {
	case <-up:
	case <-ctx.Done():
	case <-c.closing:
	}
}

// current is the open session's id, or why there is none.
func (c *conn) current() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", errClosed()
	}
	if !c.connected {
		return "", errDown()
	}
	return c.session.id, nil
}

// ready waits (see wait) and returns the open session's id.
func (c *conn) ready(ctx context.Context) (string, error) {
	c.wait(ctx)
	return c.current()
}

// register makes r and keeps it for replay; nothing is kept if it fails.
func (c *conn) register(ctx context.Context, r *registration) error {
	c.wait(ctx)
	c.ops.Lock()
	defer c.ops.Unlock()
	sessionID, err := c.current()
	if err == nil {
		callCtx, cancel := bounded(ctx, c.callTimeout)
		err = c.make(callCtx, r, sessionID)
		cancel()
	}
	if err != nil {
		c.providers.remove(r.providerKey)
		if isNoAnswer(err) {
			c.restart() // it may be registered there: a new session drops it
		}
		return err
	}
	c.mu.Lock()
	c.regs = append(c.regs, r)
	c.mu.Unlock()
	c.wrote(r.revision)
	return nil
}

// dispose disposes r (and, for a scope, forgets what was made through it). A
// listener's stream's end disposes it; else, or if it did not end so, a Dispose.
func (c *conn) dispose(ctx context.Context, r *registration) error {
	ctx = detached{ctx} // it completes, the caller waiting, whatever ctx does, as Python's off() from a listener's invocation
	c.ops.Lock()
	defer c.ops.Unlock()
	c.mu.Lock()
	stream := r.stream
	r.stream = nil // ended below, not closed by forget
	kept := c.regs[:0]
	for _, other := range c.regs {
		if other == r || other.scope == r {
			c.forget(other)
		} else {
			kept = append(kept, other)
		}
	}
	c.regs = kept
	held := c.holding(r)
	c.mu.Unlock()
	if stream != nil {
		if !held {
			stream.close()
		} else if stream.end(ctx, c.callTimeout) { // which closes it either way
			return nil // its stream's end disposed it
		}
	}
	c.mu.Lock()
	if !c.holding(r) {
		c.mu.Unlock()
		return nil // the sidecar has nothing of it now, and no replay will make it
	}
	request := &pb.DisposeRequest{SessionId: c.session.id, RegistrationId: r.id}
	c.mu.Unlock()
	callCtx, cancel := bounded(ctx, c.callTimeout)
	defer cancel()
	reply, err := c.rpc.Dispose(callCtx, request)
	if err == nil {
		c.wrote(reply.GetRevision())
	}
	err = answerError(callCtx, err, "Dispose")
	if isNoAnswer(err) {
		c.restart() // it may still be registered there: a new session drops it
	}
	if ReasonOf(err) == ReasonRegistrationNotFound {
		return nil // gone already: disposers stay idempotent
	}
	return err
}

// holding says whether the sidecar may hold r on the current session; c.mu is held.
func (c *conn) holding(r *registration) bool {
	return !c.closed && c.connected && r.id != ""
}

// forget drops r from this client; c.mu is held.
func (c *conn) forget(r *registration) {
	c.providers.remove(r.providerKey)
	c.cancelReinstall(r) // disposed during its backoff: not made again
	if r.stream != nil {
		r.stream.close()
		r.stream = nil
	}
}

// update replaces r's value with request's on the sidecar, then (apply) in
// what a replay makes; it returns the registry's revision after it.
func (c *conn) update(ctx context.Context, r *registration, request *pb.UpdateRequest, apply func()) (uint64, error) {
	c.wait(ctx)
	c.ops.Lock()
	defer c.ops.Unlock()
	sessionID, err := c.current()
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	request.SessionId, request.RegistrationId = sessionID, r.id
	c.mu.Unlock()
	callCtx, cancel := bounded(ctx, c.callTimeout)
	defer cancel()
	reply, err := c.rpc.Update(callCtx, request)
	if err != nil {
		err = answerError(callCtx, err, "Update")
		if isNoAnswer(err) {
			c.restart() // it may have happened there: a new session makes the value this client holds
		}
		return 0, err
	}
	if c.holds(r) {
		apply() // not disposed meanwhile
	}
	c.wrote(reply.GetRevision())
	return reply.GetRevision(), nil
}

func (c *conn) holds(r *registration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, other := range c.regs {
		if other == r {
			return true
		}
	}
	return false
}

func clamp(d, low, high time.Duration) time.Duration {
	if d < low {
		return low
	}
	return shorter(d, high)
}

func shorter(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}
