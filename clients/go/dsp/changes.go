// The change-event stream, resumed after the last revision it delivered.

package dsp

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
)

// ChangeKind is what a change is about (the proto's ChangeKind): one of the
// ChangeKind constants, or ChangeKindUnknown for a kind this package does not
// know (a newer sidecar's). A test checks the constants against the enum.
type ChangeKind string

// The change kinds, one per value of the proto's ChangeKind.
const (
	ChangeKindSection    ChangeKind = "section"
	ChangeKindContext    ChangeKind = "context"
	ChangeKindTools      ChangeKind = "tools"
	ChangeKindVariable   ChangeKind = "variable"
	ChangeKindSuppressor ChangeKind = "suppressor"
	ChangeKindListener   ChangeKind = "listener"
	ChangeKindScope      ChangeKind = "scope"
	ChangeKindConfig     ChangeKind = "config"
	ChangeKindRule       ChangeKind = "rule"
	// ChangeKindUnknown is a kind this package does not know (a newer sidecar's).
	ChangeKindUnknown ChangeKind = "unknown"
)

// ChangeAction is what a change did (the proto's ChangeAction): one of the
// ChangeAction constants, or ChangeActionUnknown (a newer sidecar's).
type ChangeAction string

// The change actions, one per value of the proto's ChangeAction.
const (
	ChangeActionRegistered   ChangeAction = "registered"
	ChangeActionUnregistered ChangeAction = "unregistered"
	// ChangeActionUpdated is a registration's value changed in place (Update).
	ChangeActionUpdated ChangeAction = "updated"
	// ChangeActionUnknown is an action this package does not know (a newer sidecar's).
	ChangeActionUnknown ChangeAction = "unknown"
)

var changeKinds = map[pb.ChangeKind]ChangeKind{
	pb.ChangeKind_CHANGE_KIND_SECTION: ChangeKindSection, pb.ChangeKind_CHANGE_KIND_CONTEXT: ChangeKindContext,
	pb.ChangeKind_CHANGE_KIND_TOOLS: ChangeKindTools, pb.ChangeKind_CHANGE_KIND_VARIABLE: ChangeKindVariable,
	pb.ChangeKind_CHANGE_KIND_SUPPRESSOR: ChangeKindSuppressor, pb.ChangeKind_CHANGE_KIND_LISTENER: ChangeKindListener,
	pb.ChangeKind_CHANGE_KIND_SCOPE: ChangeKindScope, pb.ChangeKind_CHANGE_KIND_CONFIG: ChangeKindConfig,
	pb.ChangeKind_CHANGE_KIND_RULE: ChangeKindRule,
}

var changeActions = map[pb.ChangeAction]ChangeAction{
	pb.ChangeAction_CHANGE_ACTION_REGISTERED:   ChangeActionRegistered,
	pb.ChangeAction_CHANGE_ACTION_UNREGISTERED: ChangeActionUnregistered,
	pb.ChangeAction_CHANGE_ACTION_UPDATED:      ChangeActionUpdated,
}

func kindFromProto(kind pb.ChangeKind) ChangeKind { return named(changeKinds, kind, ChangeKindUnknown) }

func actionFromProto(action pb.ChangeAction) ChangeAction {
	return named(changeActions, action, ChangeActionUnknown)
}

// named is value's name in names, or unknown for a value this package does not know.
func named[E comparable, N ~string](names map[E]N, value E, unknown N) N {
	if name, ok := names[value]; ok {
		return name
	}
	return unknown
}

// Change is what a ChangeStream yields: a ChangeEvent, a ChangesMissed or a ChangesResynced.
type Change interface{ isChange() }

// ChangeEvent is one registration, update or disposal.
type ChangeEvent struct {
	// Revision grows by one with every change (within one incarnation).
	Revision uint64
	Kind     ChangeKind
	Action   ChangeAction
	// Name is the section's, context's or variable's name, a scope's key, a
	// tool provider's or listener's label; "" for a suppressor.
	Name string
	// Scope is the scope whose layer changed; "" for the global layer.
	Scope string
	// Ref names the registration in its every event and in a Snapshot.
	Ref string
	// Fingerprint is its static value's after the change; "" when it has none.
	Fingerprint string
	// Reason is why the sidecar disposed it on its own, e.g. `ejected: listener
	// "sign" did not answer within 5s`; "" for every other change.
	Reason string
	// ReboundScopes are the scope keys whose parent binding it made or undid:
	// their chains, and their descendants', changed; nil for most changes.
	ReboundScopes []string
	// Global says it concerns every scope's assemblies (the global layer's, or a
	// listener or rule that runs everywhere); nil: not said, by a sidecar before
	// ChangeEvent.global.
	Global *bool
}

// ChangesMissed says this watcher fell behind and events were dropped.
type ChangesMissed struct {
	FirstRevision  uint64
	Count          uint64
	ResyncRevision uint64
}

// ChangesResynced says the changes since the last one delivered could not be
// replayed ("restarted": another incarnation; "behind": past the sidecar's
// history): rebuild your view from Snapshot; the changes after it follow.
type ChangesResynced struct {
	Reason   string
	Snapshot *Snapshot
}

func (ChangeEvent) isChange()     {}
func (ChangesMissed) isChange()   {}
func (ChangesResynced) isChange() {}

// WatchOption filters a watch or a listing, or says where a watch resumes.
type WatchOption func(*watchOptions)

type watchOptions struct {
	filter      pb.ChangeFilter
	after       *uint64
	incarnation string
	values      bool
}

// InScope keeps only scope key's layer; with ancestors, also its ancestors'
// layers and the global one: everything that scope's assemblies are made of.
func InScope(key string, ancestors bool) WatchOption {
	return func(o *watchOptions) { o.filter.Scope, o.filter.Ancestors = key, ancestors }
}

// OfKinds keeps only these kinds.
func OfKinds(kinds ...ChangeKind) WatchOption {
	return func(o *watchOptions) {
		for number, name := range changeKinds {
			for _, kind := range kinds {
				if kind == name {
					o.filter.Kinds = append(o.filter.Kinds, number)
				}
			}
		}
	}
}

// AfterRevision replays the changes after revision (the last one seen) first,
// from the sidecar's bounded history; incarnation is the one it belongs to.
func AfterRevision(revision uint64, incarnation string) WatchOption {
	return func(o *watchOptions) { o.after, o.incarnation = &revision, incarnation }
}

// WithValues makes a Snapshot carry each static value.
func WithValues() WatchOption { return func(o *watchOptions) { o.values = true } }

func collect(opts []WatchOption) *watchOptions {
	o := &watchOptions{}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// watchFeatures: this client reads a ChangeBatch as the events it holds.
var watchFeatures = []string{"change-batches"}

// WatchChanges subscribes to change events; the subscription is in place when
// it returns. ctx bounds the subscribing alone (the sidecar's confirmation,
// like any call): the stream runs on after ctx ends, until closed. The stream
// resumes by itself after a restart or a dropped connection, replaying what it
// missed or, when it cannot, yielding one ChangesResynced with a fresh Snapshot.
func (c *Client) WatchChanges(ctx context.Context, opts ...WatchOption) (*ChangeStream, error) {
	if _, err := c.c.ready(ctx); err != nil {
		return nil, err
	}
	o := collect(opts)
	s := &ChangeStream{
		stopper: stopper{c: c.c, closing: make(chan struct{})},
		request: &pb.WatchChangesRequest{
			Filter: &o.filter, AfterRevision: o.after, Incarnation: o.incarnation, Features: watchFeatures,
		},
		incarnation: o.incarnation,
	}
	if o.after != nil {
		s.lastRevision = *o.after
	}
	if err := s.subscribe(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if s.Revision == 0 {
		s.Revision = s.lastRevision
	}
	if err := s.kept(); err != nil {
		return nil, err
	}
	return s, nil
}

// ChangeStream yields change events in revision order; read it with Next from
// one goroutine. Close it to stop watching.
type ChangeStream struct {
	// Revision is the registry's revision when the subscription started.
	Revision uint64

	stopper
	request  *pb.WatchChangesRequest
	messages chan received[*pb.WatchChangesResponse]

	incarnation  string
	lastRevision uint64
	skipUntil    uint64 // events up to this revision are in a resync's snapshot
	pending      []Change
	batched      []*pb.WatchChangesResponse
	// onBreak hears (in Next) that the stream broke, onResume that it is
	// subscribed again: changes may pass unseen between them (the local cache's).
	onBreak, onResume func()
}

// LastRevision is the last revision delivered (or covered by a gap or a
// snapshot): with Incarnation, what AfterRevision takes to resume elsewhere.
func (s *ChangeStream) LastRevision() uint64 { return s.lastRevision }

// Incarnation is the sidecar incarnation the revisions belong to.
func (s *ChangeStream) Incarnation() string { return s.incarnation }

// Close stops watching; a Next waiting returns io.EOF.
func (s *ChangeStream) Close() { s.stop() }

// stopper ends a watch (a ChangeStream, a PromptStream) once, by its owner or
// with its client.
type stopper struct {
	c       *conn
	closing chan struct{}
	closeMu sync.Mutex
	closed  bool
	cancel  context.CancelFunc // the current call's; nil before the first
}

// kept has the client close the watch with it; a closed client's is closed now.
func (w *stopper) kept() error {
	w.c.mu.Lock()
	closed := w.c.closed
	if !closed {
		w.c.streams[w] = struct{}{}
	}
	w.c.mu.Unlock()
	if closed {
		w.stop()
		return errClosed()
	}
	return nil
}

func (w *stopper) stop() {
	w.closeMu.Lock()
	defer w.closeMu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.closing)
		w.c.mu.Lock()
		delete(w.c.streams, w)
		w.c.mu.Unlock()
	}
	if w.cancel != nil {
		w.cancel()
	}
}

func (w *stopper) isClosed() bool {
	w.closeMu.Lock()
	defer w.closeMu.Unlock()
	return w.closed
}

// Next returns the next change: a ChangeEvent, a ChangesMissed or a
// ChangesResynced. It returns io.EOF once the stream is closed, ctx's error
// when ctx ends first, and a PROTOCOL_ERROR (closing the stream) when the
// sidecar breaks revision order.
func (s *ChangeStream) Next(ctx context.Context) (Change, error) {
	for {
		if len(s.pending) > 0 {
			change := s.pending[0]
			s.pending = s.pending[1:]
			return change, nil
		}
		message, err := s.read(ctx)
		if err != nil {
			return nil, err
		}
		if message == nil {
			if s.onBreak != nil {
				s.onBreak()
			}
			if err := s.resume(ctx); err != nil {
				return nil, err
			}
			if s.onResume != nil {
				s.onResume()
			}
			continue
		}
		if change, err := s.handle(message); change != nil || err != nil {
			return change, err
		}
	}
}

// handle is one message's change, nil for one to skip.
func (s *ChangeStream) handle(message *pb.WatchChangesResponse) (Change, error) {
	switch kind := message.GetKind().(type) {
	case *pb.WatchChangesResponse_Event:
		if kind.Event.GetRevision() <= s.skipUntil {
			return nil, nil
		}
		return s.event(kind.Event)
	case *pb.WatchChangesResponse_Missed:
		return s.missed(kind.Missed)
	case *pb.WatchChangesResponse_Batch:
		for _, event := range kind.Batch.GetEvents() {
			s.batched = append(s.batched, &pb.WatchChangesResponse{Kind: &pb.WatchChangesResponse_Event{Event: event}})
		}
		if kind.Batch.Missed != nil {
			s.batched = append(s.batched, &pb.WatchChangesResponse{Kind: &pb.WatchChangesResponse_Missed{Missed: kind.Batch.Missed}})
		}
	case *pb.WatchChangesResponse_Subscribed:
		return nil, s.broken("a second WatchSubscribed on the change stream")
	}
	return nil, nil // a kind this client does not know (a newer sidecar's) is skipped
}

// read is the next message; nil when the stream broke and is to be resumed.
func (s *ChangeStream) read(ctx context.Context) (*pb.WatchChangesResponse, error) {
	if len(s.batched) > 0 {
		message := s.batched[0]
		s.batched = s.batched[1:]
		return message, nil
	}
	select {
	case r := <-s.messages:
		if s.isClosed() {
			return nil, io.EOF
		}
		if r.err == nil {
			return r.message, nil
		}
		if resumable(r.err) {
			return nil, nil
		}
		s.Close()
		return nil, fromRPC(r.err)
	case <-ctx.Done():
		return nil, fromRPC(ctx.Err())
	case <-s.closing:
		return nil, io.EOF
	}
}

// resumable is a break to resume after: the sidecar ended the stream, went
// away or restarted, or the connection dropped.
func resumable(err error) bool {
	if errors.Is(err, io.EOF) {
		return true
	}
	failure := fromRPC(err).(*Error)
	switch failure.Code {
	case codes.Unavailable, codes.Canceled, codes.Unknown, codes.DeadlineExceeded:
		return true
	case codes.Internal: // a stream reset by a dying connection, with no status from the sidecar
		return strings.Contains(failure.Message, "RST_STREAM")
	}
	return false
}

// resume subscribes again after the last revision delivered, with backoff until it works.
func (s *ChangeStream) resume(ctx context.Context) error {
	last := s.lastRevision
	s.request.AfterRevision, s.request.Incarnation = &last, s.incarnation
	delay := firstBackoff
	for {
		err := s.subscribe(ctx)
		if err == nil {
			return nil
		}
		if s.isClosed() {
			return io.EOF
		}
		var failure *Error
		if errors.As(err, &failure) && failure.Reason == ReasonProtocolError || !resumable(err) {
			s.Close()
			return err
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return fromRPC(ctx.Err())
		case <-s.closing:
			return io.EOF
		}
		delay = shorter(2*delay, maxBackoff)
	}
}

func (s *ChangeStream) subscribe(ctx context.Context) error {
	callCtx, cancel := context.WithCancel(context.Background())
	call, err := s.c.rpc.WatchChanges(callCtx, s.request)
	if err != nil {
		cancel()
		return fromRPC(err)
	}
	waiting, done := bounded(ctx, s.c.callTimeout) // the call alone: the stream keeps callCtx
	defer done()
	first, err := firstMessage(waiting, call.Recv, cancel, "watching changes")
	if err != nil {
		return streamEnded(err, "it closed the change stream")
	}
	subscribed := first.GetSubscribed()
	if subscribed == nil {
		cancel()
		return protocolError("the change stream did not start with WatchSubscribed")
	}
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		cancel()
		return io.EOF
	}
	s.cancel = cancel
	s.messages = make(chan received[*pb.WatchChangesResponse], 16)
	s.closeMu.Unlock()
	go forward(callCtx, call.Recv, s.messages)
	restarted := s.incarnation != "" && subscribed.GetIncarnation() != s.incarnation
	s.incarnation = subscribed.GetIncarnation()
	if s.request.AfterRevision == nil {
		s.lastRevision, s.Revision = subscribed.GetRevision(), subscribed.GetRevision()
	} else if subscribed.GetResync() {
		if err := s.resync(ctx, restarted); err != nil {
			cancel()
			return err
		}
	}
	return nil
}

// forward reads a watch call into messages until it ends.
func forward[M any](ctx context.Context, recv func() (M, error), messages chan<- received[M]) {
	for {
		message, err := recv()
		select {
		case messages <- received[M]{message, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// resync takes a listing: the events it already holds are skipped from here on.
func (s *ChangeStream) resync(ctx context.Context, restarted bool) error {
	listCtx, cancel := context.WithTimeout(ctx, s.c.callTimeout)
	defer cancel()
	snapshot, err := s.c.list(listCtx, &pb.ListRegistrationsRequest{Filter: s.request.Filter})
	if err != nil {
		return err
	}
	s.skipUntil, s.lastRevision, s.incarnation = snapshot.Revision, snapshot.Revision, snapshot.Incarnation
	reason := "behind"
	if restarted {
		reason = "restarted"
	}
	s.pending = append(s.pending, ChangesResynced{Reason: reason, Snapshot: snapshot})
	return nil
}

func (s *ChangeStream) event(m *pb.ChangeEvent) (Change, error) {
	if m.GetRevision() <= s.lastRevision {
		return nil, s.broken("change event %d after %d", m.GetRevision(), s.lastRevision)
	}
	s.lastRevision = m.GetRevision()
	return eventFromProto(m), nil
}

func eventFromProto(m *pb.ChangeEvent) ChangeEvent {
	return ChangeEvent{
		Revision: m.GetRevision(), Kind: kindFromProto(m.GetKind()), Action: actionFromProto(m.GetAction()),
		Name: m.GetName(), Scope: m.GetScope(), Ref: m.GetRef(), Fingerprint: m.GetFingerprint(),
		Reason: m.GetReason(), ReboundScopes: m.GetReboundScopes(), Global: m.Global,
	}
}

func (s *ChangeStream) missed(m *pb.ChangesMissed) (Change, error) {
	first, count, resync := m.GetFirstMissedRevision(), m.GetCount(), m.GetResyncRevision()
	if first <= s.lastRevision || count < 1 || resync < first {
		return nil, s.broken("missed %d changes from %d to %d after %d", count, first, resync, s.lastRevision)
	}
	s.lastRevision = resync
	return ChangesMissed{FirstRevision: first, Count: count, ResyncRevision: resync}, nil
}

// broken ends the stream: a watcher must not act on events out of order.
func (s *ChangeStream) broken(format string, args ...any) error {
	s.Close()
	return protocolError(format, args...)
}
