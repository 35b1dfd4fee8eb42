// *Error, every failure with its gRPC code, reason and the sidecar's words; the Reason constants.

package dsp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Reason is the stable, machine-readable cause of a failure: the name of a
// value of the proto's ErrorReason enum, as the sidecar's google.rpc.ErrorInfo
// carries it. Branch on it, never on an error's message. A reason this package
// does not know (from a newer sidecar) is kept as its string.
type Reason string

// The reasons of the proto's ErrorReason enum (docs/protocol.md, "Errors"), one
// per value and named for it: reasons_test.go checks them against the generated enum.
// SIDECAR_UNAVAILABLE, SESSION_CLOSED, INVALID_VALUE, PROTOCOL_ERROR and
// UNKNOWN are client-side: this package gives them to failures it detects
// itself, so that every error has a reason.
const (
	ReasonDuplicateName            Reason = "DUPLICATE_NAME"
	ReasonInvalidName              Reason = "INVALID_NAME"
	ReasonInvalidOrder             Reason = "INVALID_ORDER"
	ReasonInvalidVariableName      Reason = "INVALID_VARIABLE_NAME"
	ReasonInvalidJSON              Reason = "INVALID_JSON"
	ReasonMissingValue             Reason = "MISSING_VALUE"
	ReasonDuplicateProviderKey     Reason = "DUPLICATE_PROVIDER_KEY"
	ReasonValueTooLarge            Reason = "VALUE_TOO_LARGE"
	ReasonInvalidScope             Reason = "INVALID_SCOPE"
	ReasonScopeParentConflict      Reason = "SCOPE_PARENT_CONFLICT"
	ReasonScopeCycle               Reason = "SCOPE_CYCLE"
	ReasonScopeNotFound            Reason = "SCOPE_NOT_FOUND"
	ReasonRegistrationNotFound     Reason = "REGISTRATION_NOT_FOUND"
	ReasonNotUpdatable             Reason = "NOT_UPDATABLE"
	ReasonWrongValueKind           Reason = "WRONG_VALUE_KIND"
	ReasonReportNotFound           Reason = "REPORT_NOT_FOUND"
	ReasonInvalidToolOrder         Reason = "INVALID_TOOL_ORDER"
	ReasonMultipleCompleteSections Reason = "MULTIPLE_COMPLETE_SECTIONS"
	ReasonUnknownToolOrderName     Reason = "UNKNOWN_TOOL_ORDER_NAME"
	ReasonReservedToolName         Reason = "RESERVED_TOOL_NAME"
	ReasonInvariantViolation       Reason = "INVARIANT_VIOLATION"
	ReasonRenderFailed             Reason = "RENDER_FAILED"
	ReasonBadToolSlot              Reason = "BAD_TOOL_SLOT"
	ReasonProviderFailed           Reason = "PROVIDER_FAILED"
	ReasonProviderTimeout          Reason = "PROVIDER_TIMEOUT"
	ReasonProviderUnavailable      Reason = "PROVIDER_UNAVAILABLE"
	ReasonListenerFailed           Reason = "LISTENER_FAILED"
	ReasonListenerTimeout          Reason = "LISTENER_TIMEOUT"
	ReasonListenerUnavailable      Reason = "LISTENER_UNAVAILABLE"
	ReasonUnknownSession           Reason = "UNKNOWN_SESSION"
	ReasonBadStream                Reason = "BAD_STREAM"
	ReasonQuotaExceeded            Reason = "QUOTA_EXCEEDED"
	ReasonUnauthenticated          Reason = "UNAUTHENTICATED"
	ReasonShuttingDown             Reason = "SHUTTING_DOWN"
	ReasonSidecarUnavailable       Reason = "SIDECAR_UNAVAILABLE"
	ReasonSessionClosed            Reason = "SESSION_CLOSED"
	ReasonInvalidValue             Reason = "INVALID_VALUE"
	ReasonProtocolError            Reason = "PROTOCOL_ERROR"
	ReasonUnknown                  Reason = "UNKNOWN"
	ReasonStreamStalled            Reason = "STREAM_STALLED"
	ReasonResponseTooLarge         Reason = "RESPONSE_TOO_LARGE"
	ReasonPermissionDenied         Reason = "PERMISSION_DENIED"
	ReasonRuleInvalid              Reason = "RULE_INVALID"
	ReasonRuleFailed               Reason = "RULE_FAILED"
	ReasonToolsFrozen              Reason = "TOOLS_FROZEN"
	ReasonOutOfReach               Reason = "OUT_OF_REACH"
)

// Error is every failure of this package: the gRPC status code, the stable
// Reason and the sidecar's own message. Use errors.As to get it:
//
//	var failure *dsp.Error
//	if errors.As(err, &failure) && failure.Reason == dsp.ReasonDuplicateName { ... }
//
// A call that its ctx ended wraps ctx's error: errors.Is(err, context.Canceled)
// when ctx was cancelled, errors.Is(err, context.DeadlineExceeded) when its
// deadline passed, also when the sidecar answered PROVIDER_TIMEOUT or
// LISTENER_TIMEOUT a moment before it because that deadline cut the callback's
// time. A call the sidecar left unanswered within ctx's deadline or the call
// timeout (UNAVAILABLE, ReasonSidecarUnavailable) is context.DeadlineExceeded
// too. The sidecar's other failures, its own callback timeouts included, wrap nothing.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Reason is the ErrorInfo reason; ReasonUnknown when the failure carried none.
	Reason Reason
	// Message is the sidecar's text (the registry's own wording), or this package's.
	Message string
	// unanswered marks a call the sidecar took and never answered: it may have happened.
	unanswered bool
	// cause is the context error that ended the call, for errors.Is; nil for the rest.
	cause error
}

// Error returns the message, as the sidecar worded it.
func (e *Error) Error() string { return e.Message }

// Unwrap returns context.Canceled or context.DeadlineExceeded when that ended
// the call, else nil.
func (e *Error) Unwrap() error { return e.cause }

// ReasonOf returns the Reason of err when it is (or wraps) an *Error, else "".
func ReasonOf(err error) Reason {
	var failure *Error
	if errors.As(err, &failure) {
		return failure.Reason
	}
	return ""
}

const errorDomainInfo = "type.googleapis.com/google.rpc.ErrorInfo"

// fromRPC turns what a gRPC call returned into an *Error (nil stays nil).
// A cancelled or expired ctx is reported as such, with the reason UNKNOWN,
// and wrapped.
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	var failure *Error
	if errors.As(err, &failure) {
		return failure
	}
	var cause error
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			cause = err
		}
	}
	reason := errorInfoReason(st)
	message := st.Message()
	if message == "" {
		message = st.Code().String()
	}
	if reason == "" {
		reason = ReasonUnknown
		if st.Code() == codes.Unavailable {
			return &Error{Code: codes.Unavailable, Reason: ReasonSidecarUnavailable, Message: "sidecar unavailable: " + message}
		}
	}
	return &Error{Code: st.Code(), Reason: reason, Message: message, cause: cause}
}

// deadlineMargin is the most the sidecar answers before the caller's deadline
// when that cut a callback's time short, so the error naming it arrives in time
// (docs/protocol.md, "The session stream": "minus a small margin").
const deadlineMargin = 100 * time.Millisecond

// callError is fromRPC for a call made with ctx: a call that ctx ended wraps
// ctx's error, which gRPC's status for it does not.
func callError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	failure := fromRPC(err).(*Error)
	cause := endedBy(ctx, failure.Code)
	if cause == nil || failure.cause != nil {
		return failure
	}
	wrapped := *failure
	wrapped.cause = cause
	return &wrapped
}

// endedBy is ctx's error when it ended a call that failed with code: CANCELED
// or DEADLINE_EXCEEDED after ctx ended, or DEADLINE_EXCEEDED within the
// sidecar's margin of ctx's deadline (a provider or listener timeout that the
// deadline cut short); else nil.
func endedBy(ctx context.Context, code codes.Code) error {
	if code != codes.Canceled && code != codes.DeadlineExceeded {
		return nil
	}
	if ended := ctx.Err(); ended != nil {
		return ended
	}
	if deadline, ok := ctx.Deadline(); ok && code == codes.DeadlineExceeded && time.Until(deadline) <= deadlineMargin {
		return context.DeadlineExceeded
	}
	return nil
}

// errorInfoReason reads the reason of the status's google.rpc.ErrorInfo detail.
// ErrorInfo{1: reason} is one field: reading it here spares a dependency on
// googleapis' generated types.
func errorInfoReason(st *status.Status) Reason {
	for _, detail := range st.Proto().GetDetails() {
		if detail.GetTypeUrl() != errorDomainInfo {
			continue
		}
		value := detail.GetValue()
		for len(value) > 0 {
			number, wire, n := protowire.ConsumeTag(value)
			if n < 0 {
				return ""
			}
			value = value[n:]
			if number == 1 && wire == protowire.BytesType {
				reason, m := protowire.ConsumeBytes(value)
				if m < 0 {
					return ""
				}
				return Reason(reason)
			}
			m := protowire.ConsumeFieldValue(number, wire, value)
			if m < 0 {
				return ""
			}
			value = value[m:]
		}
	}
	return ""
}

func newError(code codes.Code, reason Reason, format string, args ...any) *Error {
	return &Error{Code: code, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// invalid is an argument refused before anything is sent.
func invalid(format string, args ...any) *Error {
	return newError(codes.InvalidArgument, ReasonInvalidValue, format, args...)
}

// protocolError is a sidecar that sent what the protocol does not allow.
func protocolError(format string, args ...any) *Error {
	return newError(codes.Internal, ReasonProtocolError, "protocol error: "+format, args...)
}

// noAnswerWithin is a call the sidecar took and did not answer within what
// bounded it (the call timeout, or the caller's deadline).
func noAnswerWithin(what, within string) *Error {
	failure := newError(codes.Unavailable, ReasonSidecarUnavailable,
		"sidecar unavailable: no answer to %s within %s", what, within)
	failure.unanswered = true
	failure.cause = context.DeadlineExceeded
	return failure
}

// isNoAnswer tells a noAnswer from other failures: the call may have happened.
func isNoAnswer(err error) bool {
	var failure *Error
	return errors.As(err, &failure) && failure.unanswered
}

// errClosed is a call on a closed client.
func errClosed() *Error {
	return newError(codes.FailedPrecondition, ReasonSessionClosed,
		"this client is closed: its session and registrations are gone")
}

// errDown is a call while the connection is being re-established.
func errDown() *Error {
	return newError(codes.Unavailable, ReasonSidecarUnavailable,
		"sidecar unavailable: the connection is down and being re-established")
}

// boundKey keys the bound (a string: "10s", "the caller's deadline (50ms)")
// that bounded returns a call's context with, for answerError to name.
type boundKey struct{}

// bounded is ctx bounded by the call timeout as well: a call the sidecar
// answers at once. Its noAnswer names the caller's deadline when that comes first.
func bounded(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	within := timeout.String()
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < timeout {
		within = fmt.Sprintf("the caller's deadline (%s)", time.Until(deadline).Round(time.Millisecond))
	}
	return context.WithTimeout(context.WithValue(ctx, boundKey{}, within), timeout)
}

// answerError is the error of a call made with bounded's ctx: its deadline
// passing means the sidecar is not answering.
func answerError(ctx context.Context, err error, what string) error {
	if err == nil {
		return nil
	}
	failure := callError(ctx, err).(*Error)
	// The sidecar's own timeouts carry a reason; without one, the deadline was
	// this call's (the sidecar may say so a moment before the client's timer does).
	if failure.Code == codes.DeadlineExceeded && failure.Reason == ReasonUnknown {
		within, _ := ctx.Value(boundKey{}).(string)
		return noAnswerWithin(what, within)
	}
	return failure
}
