// Assemble and Render, and their options.

package dsp

import (
	"context"
	"encoding/json"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc"
)

// AssembleOption says what one assembly is for.
type AssembleOption func(*assembleRequest)

type assembleRequest struct {
	message *pb.AssembleRequest
	err     error
	skipped *[]SkippedStep  // WithSkipped's
	report  *AssemblyReport // WithReport's
}

// WithSkipped sets *into to the steps the assembly went on without (callbacks
// under FailurePolicyIgnore that failed; nil when it is complete), as grpc.Trailer
// hands back a call's trailers: the Assembly itself stays the assembled prompt.
func WithSkipped(into *[]SkippedStep) AssembleOption {
	return func(r *assembleRequest) { r.skipped = into }
}

// ForScope assembles for scope key: its chain's layers join the global one.
func ForScope(key string) AssembleOption {
	return func(r *assembleRequest) { r.message.Context.Scope = key }
}

// WithFields passes fields (a JSON object) to every dynamic provider and listener.
func WithFields(fields map[string]any) AssembleOption {
	return func(r *assembleRequest) {
		text, err := json.Marshal(fields)
		if err != nil {
			r.err = invalid("fields are not JSON-serialisable: %v", err)
			return
		}
		r.message.Context.FieldsJson = string(text)
	}
}

// Assemble assembles the prompt. ctx's deadline and cancellation reach the
// sidecar and, through it, every provider and listener the assembly asks.
// While the connection is down it fails fast with UNAVAILABLE, or, when ctx
// has a deadline, waits for the reconnect until then. Once ctx is cancelled the
// error is errors.Is(err, context.Canceled) (a *Error, Canceled); past its
// deadline errors.Is(err, context.DeadlineExceeded), also for the
// ReasonProviderTimeout or ReasonListenerTimeout the sidecar answers a moment
// before that deadline. A callback timeout of the sidecar's own, within a later
// deadline, is neither.
func (c *Client) Assemble(ctx context.Context, opts ...AssembleOption) (*Assembly, error) {
	reply, err := c.assemble(ctx, false, opts)
	if err != nil {
		return nil, err
	}
	return reply.assembly, nil
}

// Render assembles and renders on the sidecar: the prompt text, the
// runtime-context snapshot and the assembly. A strict-interpolation failure is
// FAILED_PRECONDITION, ReasonRenderFailed. ctx's end is errors.Is as for Assemble.
func (c *Client) Render(ctx context.Context, opts ...AssembleOption) (*Rendered, error) {
	reply, err := c.assemble(ctx, true, opts)
	if err != nil {
		return nil, err
	}
	return &Rendered{Prompt: reply.prompt, ContextSnapshot: reply.contextSnapshot, Assembly: reply.assembly, Skipped: reply.skipped}, nil
}

func (c *Client) assemble(ctx context.Context, render bool, opts []AssembleOption) (*assembleReply, error) {
	request := assembleRequest{message: &pb.AssembleRequest{Context: &pb.AssembleContext{}, Render: render}}
	for _, opt := range opts {
		opt(&request)
	}
	if request.err != nil {
		return nil, request.err
	}
	local, scope, fields := c.c.local, request.message.Context.Scope, request.message.Context.FieldsJson
	if render || request.message.Report || request.message.ToolFreeze != pb.ToolFreeze_TOOL_FREEZE_UNSPECIFIED {
		local = nil // none is kept; a freeze without a report is the sidecar's to refuse
	}
	if local != nil {
		if kept := local.get(scope, fields, c.Connected()); kept != nil {
			if request.skipped != nil {
				*request.skipped = nil // a kept answer is one of a plan with no callback
			}
			return &assembleReply{assembly: kept}, nil
		}
	}
	ticket := local.now(scope)
	if _, err := c.c.ready(ctx); err != nil {
		return nil, err
	}
	reply := &assembleReply{}
	if err := c.c.cc.Invoke(ctx, assembleMethod, request.message, reply, grpc.ForceCodec(replyCodec{})); err != nil {
		return nil, callError(ctx, err)
	}
	if local != nil {
		local.put(ticket, scope, fields, reply)
	}
	if request.skipped != nil {
		*request.skipped = reply.skipped
	}
	if request.report != nil && reply.report != nil {
		*request.report = *reply.report
	}
	return reply, nil
}
