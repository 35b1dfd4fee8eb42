// The session stream: its life cycle, and answering the sidecar's ProvideRequests.

package dsp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// framingBytes is the OpenSessionRequest around a ProvideResponse, with room to spare.
const framingBytes = 64

// featureEachAnswer, offered on the session: this client answers a ProvideRequest
// provider by provider, so the sidecar judges each against its own time and a
// slow provider gets no other ejected with it (docs/protocol.md, "Versions and features").
const featureEachAnswer = "each-answer"

// ClientVersion is sent in SessionStart, for the sidecar's logs only.
const ClientVersion = "dsh-system-prompt-go/0.1.0"

// session is one OpenSession stream: everything registered on it lives as long
// as the stream does. While open, the sidecar asks on it for provider values.
type session struct {
	c              *conn
	id             string
	sidecarVersion string
	callbackCache  bool // the sidecar confirmed "callback-cache"
	eachAnswer     bool // the sidecar confirmed "each-answer": each value goes as it comes
	maxAnswer      int  // the sidecar's max_message_bytes less framing; 0: it did not say
	invalidations  invalidations
	stream         pb.SystemPromptService_OpenSessionClient
	cancel         context.CancelFunc
	done           chan struct{} // closed when the stream is over

	sendMu sync.Mutex // a gRPC stream takes one Send at a time

	mu        sync.Mutex
	answering map[uint64]context.CancelFunc
	ending    bool
	ended     bool
}

// openSession opens a session stream, confirmed within timeout.
func openSession(c *conn, timeout time.Duration) (*session, error) {
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.rpc.OpenSession(ctx)
	if err != nil {
		cancel()
		return nil, fromRPC(err)
	}
	start := &pb.OpenSessionRequest{Kind: &pb.OpenSessionRequest_Start{Start: &pb.SessionStart{
		ClientName: c.clientName, ClientVersion: ClientVersion, Features: []string{featureCallbackCache, featureEachAnswer},
	}}}
	_ = stream.Send(start) // a failed send shows as the stream's end, read below
	waiting, done := bounded(context.Background(), timeout)
	defer done()
	first, err := firstMessage(waiting, stream.Recv, cancel, "opening the session")
	if err != nil {
		return nil, streamEnded(err, "it ended the session stream before opening it")
	}
	opened := first.GetOpened()
	if opened == nil || opened.GetSessionId() == "" {
		cancel()
		return nil, protocolError("the session stream did not start with SessionOpened")
	}
	s := &session{
		c: c, id: opened.GetSessionId(), sidecarVersion: opened.GetSidecarVersion(),
		stream: stream, cancel: cancel, done: make(chan struct{}),
		answering:     map[uint64]context.CancelFunc{},
		callbackCache: contains(opened.GetFeatures(), featureCallbackCache),
		eachAnswer:    contains(opened.GetFeatures(), featureEachAnswer),
	}
	if limit := int(opened.GetMaxMessageBytes()); limit > framingBytes {
		s.maxAnswer = limit - framingBytes
	}
	go s.read()
	return s, nil
}

// firstMessage receives a stream's first message before waiting (bounded's
// ctx) ends; past it the stream is cancelled (a silent sidecar keeps no stream
// of ours). The stream's own ctx is apart: once confirmed, it outlives waiting.
func firstMessage[M any](waiting context.Context, recv func() (M, error), cancel func(), what string) (M, error) {
	arrived := make(chan received[M], 1)
	go func() {
		m, err := recv()
		arrived <- received[M]{m, err}
	}()
	select {
	case r := <-arrived:
		if r.err != nil {
			cancel()
		}
		return r.message, r.err
	case <-waiting.Done():
		cancel()
		var none M
		return none, answerError(waiting, waiting.Err(), what)
	}
}

// received is one message a stream's Recv returned, or its error.
type received[M any] struct {
	message M
	err     error
}

// streamEnded is the error of a stream the sidecar ended before confirming it:
// its own error, or UNAVAILABLE when it ended with OK, which says nothing.
func streamEnded(err error, what string) error {
	var failure *Error
	if errors.As(err, &failure) {
		return failure
	}
	if errors.Is(err, io.EOF) {
		return newError(codes.Unavailable, ReasonSidecarUnavailable, "sidecar unavailable: %s", what)
	}
	return fromRPC(err)
}

func (s *session) read() {
	for {
		message, err := s.stream.Recv()
		if err != nil {
			s.finish()
			return
		}
		switch kind := message.GetKind().(type) {
		case *pb.OpenSessionResponse_Provide:
			s.provide(kind.Provide)
		case *pb.OpenSessionResponse_Cancel:
			s.mu.Lock()
			if cancel := s.answering[kind.Cancel.GetCallId()]; cancel != nil {
				cancel()
			}
			s.mu.Unlock()
		case *pb.OpenSessionResponse_Invalidated:
			s.invalidations.confirmed(kind.Invalidated.GetInvalidateId())
		case *pb.OpenSessionResponse_Ejected:
			// A provider did not answer in time and is gone: made again after a backoff.
			s.c.providerEjected(s, kind.Ejected.GetRegistrationId(), ejectedWhy(kind.Ejected))
		}
		// A second `opened`, and a kind this client does not know (a newer
		// sidecar's), are ignored: the first `opened` named the session.
	}
}

func (s *session) finish() {
	s.mu.Lock()
	s.ended = true
	s.cancelAnswers()
	lost := !s.ending
	s.mu.Unlock()
	s.invalidations.release()
	close(s.done)
	s.cancel()
	if lost {
		s.c.lost(s)
	}
}

func (s *session) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// provide answers one ProvideRequest, unless the same call is being answered.
func (s *session) provide(request *pb.ProvideRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, running := s.answering[request.GetCallId()]; running || s.ended {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if timeout := request.GetTimeoutS(); timeout > 0 {
		// The provider's context ends when the sidecar stops waiting for it.
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(timeout*float64(time.Second)))
	}
	s.answering[request.GetCallId()] = cancel
	go s.answer(ctx, cancel, request)
}

func (s *session) answer(ctx context.Context, cancel context.CancelFunc, request *pb.ProvideRequest) {
	defer cancel()
	callID := request.GetCallId()
	var values []*pb.ProvidedValue
	if s.eachAnswer {
		// Each value goes as it comes: a slow provider holds up (and blames) no other.
		s.c.providers.each(ctx, request, func(_ int, value *pb.ProvidedValue) { s.provided(ctx, callID, value) })
	} else {
		values = s.c.providers.answer(ctx, request)
	}
	s.mu.Lock()
	delete(s.answering, callID)
	s.mu.Unlock()
	if !s.eachAnswer {
		s.provided(ctx, callID, values...)
	}
}

// provided sends values as (part of) the answer to callID, unless the sidecar gave
// up on it (ctx ended: nobody reads the answer).
func (s *session) provided(ctx context.Context, callID uint64, values ...*pb.ProvidedValue) {
	if ctx.Err() != nil {
		return
	}
	response := &pb.ProvideResponse{CallId: callID, Values: values}
	s.fit(response)
	s.send(&pb.OpenSessionRequest{Kind: &pb.OpenSessionRequest_Provided{Provided: response}})
}

// fit replaces the largest values of response by their providers' errors while it
// is over what the sidecar reads: the assembly fails naming them, the session lives.
func (s *session) fit(response *pb.ProvideResponse) {
	if s.maxAnswer == 0 || proto.Size(response) <= s.maxAnswer {
		return
	}
	largest := append([]*pb.ProvidedValue(nil), response.GetValues()...)
	sort.SliceStable(largest, func(i, j int) bool { return proto.Size(largest[i]) > proto.Size(largest[j]) })
	for _, value := range largest {
		size := proto.Size(value)
		message := fmt.Sprintf("its answer of %d bytes is over the sidecar's max_message_bytes", size)
		value.Value = &pb.ProvidedValue_Error{Error: &pb.ProviderError{Message: message, AnswerBytes: uint64(size)}}
		s.c.log.Warn("dsp: a provider's answer is over the sidecar's max_message_bytes",
			"provider", value.GetProviderKey(), "bytes", size)
		if proto.Size(response) <= s.maxAnswer {
			return
		}
	}
}

func (s *session) send(message *pb.OpenSessionRequest) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = s.stream.Send(message) // the session is over: that assembly has failed already
}

// cancelAnswers cancels every provider call running; s.mu is held.
func (s *session) cancelAnswers() {
	for _, cancel := range s.answering {
		cancel()
	}
}

// end half-closes the stream, its clean end: the sidecar disposes everything
// registered on it before it ends the stream.
func (s *session) end() {
	s.mu.Lock()
	if s.ending {
		s.mu.Unlock()
		return
	}
	s.ending = true
	s.cancelAnswers()
	s.mu.Unlock()
	s.sendMu.Lock()
	_ = s.stream.CloseSend()
	s.sendMu.Unlock()
	select {
	case <-s.done:
	case <-time.After(endWait):
	}
	s.cancel() // a sidecar that never closed its side keeps no stream of ours
}
