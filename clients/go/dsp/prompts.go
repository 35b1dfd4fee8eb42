// Live prompts: WatchPrompt and its PromptStream.

package dsp

import (
	"context"
	"io"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// Live prompts: WatchPrompt (docs/protocol.md, "Live prompts").

// PromptChange is the prompt of a watched scope as its static parts make it:
// first the prompt now, then one after each burst of changes.
type PromptChange struct {
	// Revision is the registry's revision it was assembled at; Incarnation the sidecar process's.
	Revision    uint64
	Incarnation string
	// Assembly holds the static parts; a dynamic part is a placeholder such as
	// `<dynamic section "cwd">`. Nil when they do not assemble (Error says why).
	Assembly *Assembly
	// Prompt and ContextSnapshot are the rendered texts, with WithRendering
	// when the prompt renders; nil otherwise.
	Prompt, ContextSnapshot *string
	// Report is the prompt-cache report against the stream's previous prompt
	// (Report.Stability.HasPrevious is false on the first).
	Report *AssemblyReport
	// Changes are the changes since the previous prompt, oldest first (none on
	// the first); ChangesOmitted counts those past the sidecar's bound.
	Changes        []ChangeEvent
	ChangesOmitted uint64
	// Error is why the static parts do not assemble, or "".
	Error string
}

// PromptOption says how a prompt is watched.
type PromptOption func(*promptRequest)

type promptRequest struct {
	message *pb.WatchPromptRequest
	err     error
}

// WithRendering renders each prompt too (PromptChange.Prompt, .ContextSnapshot).
func WithRendering() PromptOption {
	return func(r *promptRequest) { r.message.Render = true }
}

// WithLayout is WatchPrompt's WithPrefixLayout: each report's prefix is
// measured in layout instead of the sidecar's configured prefix_layout.
func WithLayout(layout PrefixLayout) PromptOption {
	return func(r *promptRequest) { r.message.PrefixLayout = layoutOption(layout, &r.err) }
}

// WatchPrompt watches the prompt of scope ("" for the global layer alone) as
// its static parts make it, change by change: each PromptChange's report says
// whether the change breaks the model server's prompt cache. Dynamic parts are
// placeholders, never evaluated; nothing is asked of any client. The watch is
// in place, and its first prompt received, when this returns; ctx bounds that
// wait alone (like any call): the stream runs on after ctx ends, until closed.
// The stream does not resume by itself: after a restart Next fails, and the
// caller watches again.
func (c *Client) WatchPrompt(ctx context.Context, scope string, opts ...PromptOption) (*PromptStream, error) {
	request := promptRequest{message: &pb.WatchPromptRequest{Scope: scope}}
	for _, opt := range opts {
		opt(&request)
	}
	err := request.err
	if err == nil {
		_, err = c.c.ready(ctx)
	}
	if err != nil {
		return nil, err
	}
	callCtx, cancel := context.WithCancel(context.Background())
	call, err := c.c.rpc.WatchPrompt(callCtx, request.message)
	if err != nil {
		cancel()
		return nil, fromRPC(err)
	}
	waiting, done := bounded(ctx, c.c.callTimeout) // the call alone: the stream keeps callCtx
	defer done()
	first, err := firstMessage(waiting, call.Recv, cancel, "watching the prompt")
	if err != nil {
		return nil, streamEnded(err, "it closed the prompt stream")
	}
	s := &PromptStream{
		stopper: stopper{c: c.c, cancel: cancel, closing: make(chan struct{})},
		first:   first, messages: make(chan received[*pb.WatchPromptResponse], 1),
	}
	go forward(callCtx, call.Recv, s.messages)
	if err := s.kept(); err != nil {
		return nil, err
	}
	return s, nil
}

// PromptStream yields a watched scope's prompts; read it with Next from one
// goroutine. Close it to stop watching.
type PromptStream struct {
	stopper
	first    *pb.WatchPromptResponse // received by WatchPrompt, not yet returned
	messages chan received[*pb.WatchPromptResponse]
}

// Next returns the next prompt: the first is the prompt when the watch
// started. It returns io.EOF once the stream is closed (or the client is),
// ctx's error when ctx ends first, and the stream's error when it broke (a
// sidecar restart, a dropped connection: watch again).
func (s *PromptStream) Next(ctx context.Context) (*PromptChange, error) {
	if s.isClosed() {
		return nil, io.EOF
	}
	if s.first != nil {
		first := s.first
		s.first = nil
		return promptChangeFromProto(first)
	}
	select {
	case r := <-s.messages:
		if s.isClosed() {
			return nil, io.EOF
		}
		if r.err != nil {
			s.Close()
			return nil, streamEnded(r.err, "it closed the prompt stream")
		}
		return promptChangeFromProto(r.message)
	case <-ctx.Done():
		return nil, fromRPC(ctx.Err())
	case <-s.closing:
		return nil, io.EOF
	}
}

// Close stops watching; a Next waiting returns io.EOF.
func (s *PromptStream) Close() { s.stop() }

func promptChangeFromProto(m *pb.WatchPromptResponse) (*PromptChange, error) {
	change := &PromptChange{
		Revision: m.GetRevision(), Incarnation: m.GetIncarnation(), ChangesOmitted: m.GetChangesOmitted(), Error: m.GetError(),
	}
	if m.Assembly != nil {
		parts, err := invocationParts(m.Assembly, nil, nil) // a PromptAssembly's parts, no slots
		if err != nil {
			return nil, err
		}
		change.Assembly = parts.assembly()
	}
	if m.Rendered != nil {
		prompt, snapshot := m.Rendered.GetPrompt(), m.Rendered.GetContextSnapshot()
		change.Prompt, change.ContextSnapshot = &prompt, &snapshot
	}
	if m.Report != nil {
		change.Report = reportFromProto(m.Report)
	}
	for _, event := range m.GetChanges() {
		change.Changes = append(change.Changes, eventFromProto(event))
	}
	return change, nil
}
