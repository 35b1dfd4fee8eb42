// A waterfall listener's stream: invocations in, Next and results out.

package dsp

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
)

// Listener is a waterfall listener, run for every assembly it is admitted to.
// It may change assembly and return next.Call(assembly) (or, cheaper,
// next.Tail(assembly)), post-process what next.Call returned, or return an
// assembly of its own without calling next. ctx ends when the sidecar abandons
// the invocation. An error fails the assembly (LISTENER_FAILED) with its message.
type Listener func(ctx context.Context, assembly *Assembly, info AssembleContext, next *Next) (*Assembly, error)

// Next hands an assembly to the rest of the waterfall, once per invocation.
type Next struct {
	stream     *listenerStream
	invocation *invocation
	used       bool
	tail       bool
}

// Call runs the rest of the chain on assembly and returns what it returned,
// for the listener to post-process.
func (n *Next) Call(assembly *Assembly) (*Assembly, error) {
	if err := n.send(assembly, false); err != nil {
		return nil, err
	}
	select {
	case returned := <-n.invocation.results:
		return n.invocation.parts.decode(returned)
	case <-n.invocation.ctx.Done():
		return nil, newError(codes.Canceled, ReasonUnknown, "the sidecar abandoned this invocation")
	}
}

// Tail runs the rest of the chain on assembly and makes what it returns this
// listener's result, untouched: one round trip instead of two. Return what it
// returns (`return next.Tail(assembly)`); whatever the listener returns after
// a Tail is ignored.
func (n *Next) Tail(assembly *Assembly) (*Assembly, error) {
	return nil, n.send(assembly, true)
}

// send hands assembly to the rest of the chain, its unchanged parts by slot.
func (n *Next) send(assembly *Assembly, tail bool) error {
	if n.used {
		return newError(codes.FailedPrecondition, ReasonListenerFailed, "next may be called once per invocation")
	}
	n.used = true
	encoded, err := n.invocation.parts.encode(assembly, n.stream.slotting)
	if err != nil {
		return err
	}
	n.tail = tail
	n.stream.send(&pb.ListenRequest{Kind: &pb.ListenRequest_Next{Next: &pb.ListenerNext{
		InvocationId: n.invocation.id, Assembly: encoded.assembly, ToolSlots: encoded.toolSlots,
		Slots: encoded.slots, Tail: tail,
	}}})
	return nil
}

// Prepend runs the listener (or rule) before the listeners and rules registered earlier.
func Prepend() StepOption { return stepFlag{prepend: true} }

// Global makes a listener (or rule) installed through a scope see every assembly anyway.
func Global() StepOption { return stepFlag{global: true} }

// ListenerName names the listener in errors and change events (default: the function's name).
func ListenerName(name string) ListenerOption {
	return listenerFlag(func(s *pb.ListenStart) { s.Name = label(name) })
}

const labelLimit = 120

// label keeps a name short for errors and change events: its end is the telling part.
func label(name string) string {
	runes := []rune(name)
	if len(runes) <= labelLimit {
		return name
	}
	return "…" + string(runes[len(runes)-labelLimit+1:])
}

// funcName is a function's name without its package path, e.g. "main.addDate".
func funcName(fn any) string {
	f := runtime.FuncForPC(reflect.ValueOf(fn).Pointer())
	if f == nil {
		return "anonymous"
	}
	name := f.Name()
	return name[strings.LastIndex(name, "/")+1:]
}

// listenerStream runs one listener for every invocation the sidecar sends.
type listenerStream struct {
	c         *conn
	owner     *registration // the listener's registration, made again if it is ejected
	sessionID string        // the session it was made on
	listener  Listener
	stream    pb.SystemPromptService_ListenClient
	cancel    context.CancelFunc
	slotting  slotting // what the sidecar confirmed: what replies name by slot
	// callbackCache: the sidecar confirmed "callback-cache"; invalidations wait for its confirmations.
	callbackCache bool
	invalidations invalidations
	// base is, with part-slots, the last invocation's parts, which the next one's
	// slots name (read goroutine only); lostBase: an invocation could not be read
	// against it, so the stream is half-closed and later invocations go unread.
	base     *parts
	lostBase bool

	sendMu sync.Mutex

	mu      sync.Mutex
	running map[uint64]*invocation
	closing bool
	ejected bool   // the sidecar said it ejected the listener: its stream's end is not a loss
	why     string // what the sidecar said of it
	ended   bool   // the stream is over
	endedOK bool   // with OK, the listener not ejected: the sidecar disposed it on the half-close

	over chan struct{} // closed once the stream is over
}

type invocation struct {
	id      uint64
	ctx     context.Context
	cancel  context.CancelFunc
	results chan *pb.ListenerNextResult
	parts   *parts // what its replies and next() results are named against
}

// startListener installs listener with start (owner's registration), confirmed
// before waiting (bounded's ctx) ends; the stream itself lives until close.
func startListener(waiting context.Context, c *conn, owner *registration, listener Listener, start *pb.ListenStart) (string, *listenerStream, error) {
	if err := waiting.Err(); err != nil {
		return "", nil, answerError(waiting, err, "installing a listener") // as a unary call would, nothing is sent
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.rpc.Listen(ctx)
	if err != nil {
		cancel()
		return "", nil, fromRPC(err)
	}
	_ = stream.Send(&pb.ListenRequest{Kind: &pb.ListenRequest_Start{Start: start}})
	first, err := firstMessage(waiting, stream.Recv, cancel, "installing a listener")
	if err != nil {
		return "", nil, streamEnded(err, "it closed the listener stream")
	}
	registered := first.GetRegistered()
	if registered == nil || registered.GetRegistrationId() == "" {
		cancel()
		return "", nil, protocolError("the listener stream did not start with ListenerRegistered")
	}
	owner.revision = registered.GetRevision()
	s := &listenerStream{
		c: c, owner: owner, sessionID: start.GetSessionId(), listener: listener, stream: stream, cancel: cancel,
		slotting: slottingOf(start, registered), running: map[uint64]*invocation{}, over: make(chan struct{}),
		callbackCache: contains(registered.GetFeatures(), featureCallbackCache),
	}
	go s.read()
	return registered.GetRegistrationId(), s, nil
}

func contains(list []string, wanted string) bool {
	for _, item := range list {
		if item == wanted {
			return true
		}
	}
	return false
}

func (s *listenerStream) read() {
	for {
		message, err := s.stream.Recv()
		if err != nil {
			s.mu.Lock()
			s.ended, s.endedOK = true, err == io.EOF && !s.ejected // before the cancels: off() may wait on one
			s.abandonAll()
			lost, ejected, why := !s.closing, s.ejected, s.why
			s.mu.Unlock()
			s.invalidations.release()
			s.cancel()
			close(s.over)
			if lost && ejected {
				s.c.listenerEjected(s.owner, s.sessionID, why) // installed again on a new stream, after a backoff
			} else if lost {
				s.c.restart() // the sidecar dropped the listener: the session is made again
			}
			return
		}
		switch kind := message.GetKind().(type) {
		case *pb.ListenResponse_Invocation:
			s.invoke(kind.Invocation)
		case *pb.ListenResponse_NextResult:
			s.mu.Lock()
			if running := s.running[kind.NextResult.GetInvocationId()]; running != nil {
				select {
				case running.results <- kind.NextResult:
				default: // a second next_result for one next(): the first counts
				}
			}
			s.mu.Unlock()
		case *pb.ListenResponse_Invalidated:
			s.invalidations.confirmed(kind.Invalidated.GetInvalidateId())
		case *pb.ListenResponse_Ejected:
			s.mu.Lock()
			s.ejected, s.why = true, ejectedWhy(kind.Ejected) // the sidecar ends the stream next
			s.mu.Unlock()
		case *pb.ListenResponse_Cancel:
			s.mu.Lock()
			if running := s.running[kind.Cancel.GetInvocationId()]; running != nil {
				running.cancel()
				delete(s.running, running.id)
			}
			s.mu.Unlock()
		}
		// A next_result nobody waits for, a second `registered` and a kind this
		// client does not know (a newer sidecar's) are ignored.
	}
}

// abandonAll cancels every invocation running; s.mu is held.
func (s *listenerStream) abandonAll() {
	for id, running := range s.running {
		running.cancel()
		delete(s.running, id)
	}
}

// invoke starts an invocation, read here in the stream's order: with part-slots
// each one is the base of the next, whether it is answered, repeated or cancelled.
func (s *listenerStream) invoke(message *pb.ListenerInvocation) {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if s.lostBase || closing {
		return // the stream is half-closed (or off() half-closes it): its end fails this invocation
	}
	var slots *pb.PartSlots // without part-slots none are read, and no base is kept
	if s.slotting == slotsParts {
		slots = message.GetSlots()
	}
	held, err := invocationParts(message.GetAssembly(), slots, s.base)
	if err != nil {
		s.base, s.lostBase = nil, true
		go s.refuse(message.GetInvocationId(), err)
		return
	}
	if s.slotting == slotsParts {
		s.base = held
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, repeated := s.running[message.GetInvocationId()]; repeated {
		return // a repeat of one running: answered once
	}
	ctx, cancel := context.WithCancel(context.Background())
	running := &invocation{
		id: message.GetInvocationId(), ctx: ctx, cancel: cancel,
		results: make(chan *pb.ListenerNextResult, 1),
		parts:   held,
	}
	s.running[running.id] = running
	go s.run(running, message)
}

func (s *listenerStream) run(running *invocation, message *pb.ListenerInvocation) {
	defer func() {
		s.mu.Lock()
		if s.running[running.id] == running {
			delete(s.running, running.id)
		}
		s.mu.Unlock()
		running.cancel()
	}()
	next := &Next{stream: s, invocation: running}
	result, err := s.call(running, message, next)
	if next.tail || running.ctx.Err() != nil {
		return // the rest of the chain answers, or the sidecar abandoned this invocation
	}
	if err == nil {
		var encoded reply
		if encoded, err = running.parts.encode(result, s.slotting); err == nil {
			s.send(&pb.ListenRequest{Kind: &pb.ListenRequest_Result{Result: &pb.ListenerResult{
				InvocationId: running.id, Assembly: encoded.assembly, ToolSlots: encoded.toolSlots, Slots: encoded.slots,
			}}})
			return
		}
	}
	s.send(&pb.ListenRequest{Kind: &pb.ListenRequest_Failure{Failure: &pb.ListenerFailure{
		InvocationId: running.id, Message: err.Error(),
	}}})
}

// call runs the listener on the invocation; a panic is its failure, not this client's.
func (s *listenerStream) call(running *invocation, message *pb.ListenerInvocation, next *Next) (result *Assembly, err error) {
	defer func() {
		if panicked := recover(); panicked != nil {
			result, err = nil, fmt.Errorf("the listener panicked: %v", panicked)
		}
	}()
	info, err := contextFromProto(message.GetContext())
	if err != nil {
		return nil, err
	}
	return s.listener(running.ctx, running.parts.assembly(), info, next)
}

func (s *listenerStream) send(message *pb.ListenRequest) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = s.stream.Send(message) // the stream is over: the sidecar has failed or dropped this invocation
}

// refuse fails an invocation whose slots cannot be right: the stream's base is
// lost, so the stream is half-closed after the failure; the sidecar then ends it,
// and the session is made again with the listener on a new stream.
func (s *listenerStream) refuse(id uint64, err error) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = s.stream.Send(&pb.ListenRequest{Kind: &pb.ListenRequest_Failure{Failure: &pb.ListenerFailure{
		InvocationId: id, Message: err.Error(),
	}}})
	_ = s.stream.CloseSend()
}

// end disposes the listener through its own stream: half-closed, the sidecar
// removes the listener and then ends the stream with OK. True once that end
// came within timeout and before ctx ended: the listener is gone, no assembly
// sees it any more. False when the stream was over or closing already, ended
// otherwise (the listener may be away, not gone) or not in time: then it is for
// a Dispose to say. The stream is closed either way. What runs goes on until
// the end, which cancels it (answers written before the half-close go first);
// invocations that come after the half-close are not started. A listener may
// call it from its own invocation, even with that invocation's ctx: the end
// cancels that ctx only once it is recorded here.
func (s *listenerStream) end(ctx context.Context, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s.mu.Lock()
	over := s.ended || s.closing
	s.closing = true // its end is this client's: nothing to install again
	s.mu.Unlock()
	if !over {
		s.sendMu.Lock()
		err := s.stream.CloseSend()
		s.sendMu.Unlock()
		if err == nil {
			select {
			case <-s.over:
			case <-ctx.Done():
			}
		}
	}
	s.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	return !over && s.endedOK
}

// close ends the stream: the sidecar removes the listener.
func (s *listenerStream) close() {
	s.mu.Lock()
	s.closing = true
	s.abandonAll()
	s.mu.Unlock()
	s.cancel()
}
