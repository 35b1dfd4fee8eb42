// The registration options: WithCallbackTimeout, WithFailurePolicy and the rest.

package dsp

import (
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// Options of a registration besides its value. The options of a callback
// (WithCallbackTimeout, WithFailurePolicy, WithCache) fit every registration with
// one, so the option types are interfaces (sealed: their methods are unexported)
// that each option implements where it fits.

// SectionOption configures Section and SectionFunc: Complete (either), and for
// SectionFunc alone (a static Section refuses them, INVALID_VALUE)
// WithCallbackTimeout, WithFailurePolicy and WithCache.
type SectionOption interface {
	applySection(request *pb.RegisterSectionRequest, asked *asked)
}

// ProviderOption configures ContextFunc, VariableFunc and ToolsFunc:
// WithCallbackTimeout, WithFailurePolicy, WithCache, and for ToolsFunc alone
// ToolsName.
type ProviderOption interface {
	applyProvider(asked *asked)
}

// ListenerOption configures OnAssemble: its place in the waterfall (Prepend,
// Global), its label (ListenerName), its own time (WithCallbackTimeout), what an
// assembly does when it fails (WithFailurePolicy) and the reuse of its result
// (WithCache).
type ListenerOption interface {
	applyListener(start *pb.ListenStart, asked *asked)
}

// CallbackOption is an option of every callback: a provider's (the ...Func
// registrations) and a listener's.
type CallbackOption struct {
	apply func(*asked)
}

// WithCallbackTimeout gives a provider or listener d to answer, instead of the
// sidecar's provider_timeout_s (up to its max_callback_timeout_s; past it the
// registration fails INVALID_ARGUMENT / VALUE_TOO_LARGE): an honest slow
// callback says so instead of being ejected (docs/protocol.md, "Ejected
// callbacks"). For a listener, d bounds each of its replies. d must be positive;
// a static section refuses it (INVALID_VALUE), as it is never asked for.
func WithCallbackTimeout(d time.Duration) CallbackOption {
	return CallbackOption{func(a *asked) { a.timeout, a.given = d, true }}
}

// FailurePolicy is what an assembly does when a provider or listener fails or does
// not answer in time (docs/protocol.md, "Failure policy"), as a Kubernetes admission
// webhook's failurePolicy.
type FailurePolicy string

const (
	// FailurePolicyFail fails the assembly, naming the callback: the spec's behaviour
	// and the default.
	FailurePolicyFail FailurePolicy = "fail"
	// FailurePolicyIgnore goes on without the callback's step and says so (see
	// WithSkipped, Rendered.Skipped). Only for a callback that decorates the prompt,
	// never for one that filters it.
	FailurePolicyIgnore FailurePolicy = "ignore"
)

var failurePolicies = map[FailurePolicy]pb.FailurePolicy{
	FailurePolicyFail:   pb.FailurePolicy_FAILURE_POLICY_FAIL,
	FailurePolicyIgnore: pb.FailurePolicy_FAILURE_POLICY_IGNORE,
}

// WithFailurePolicy says what an assembly does when the provider or listener fails
// or does not answer in time: FailurePolicyIgnore goes on without it (a listener is
// passed over as if it had called next unchanged) and names it among the skipped
// steps. A static section refuses it (INVALID_VALUE), as it is never asked for.
func WithFailurePolicy(policy FailurePolicy) CallbackOption {
	return CallbackOption{func(a *asked) { a.policy = &policy }}
}

func (o CallbackOption) applySection(_ *pb.RegisterSectionRequest, a *asked) { o.apply(a) }
func (o CallbackOption) applyProvider(a *asked)                              { o.apply(a) }
func (o CallbackOption) applyListener(_ *pb.ListenStart, a *asked)           { o.apply(a) }

// asked is how a callback is asked, as its options say.
type asked struct {
	timeout time.Duration
	given   bool           // WithCallbackTimeout was passed
	policy  *FailurePolicy // WithFailurePolicy's, if passed
	cache   *Cache         // WithCache's, if passed
	name    string         // ToolsName's, if passed
}

// failurePolicy is the callback's policy as sent: unspecified (the sidecar's FAIL) when not given.
func (a asked) failurePolicy() (pb.FailurePolicy, error) {
	if a.policy == nil {
		return pb.FailurePolicy_FAILURE_POLICY_UNSPECIFIED, nil
	}
	policy, ok := failurePolicies[*a.policy]
	if !ok {
		return 0, invalid("WithFailurePolicy wants FailurePolicyFail or FailurePolicyIgnore, not %q", *a.policy)
	}
	return policy, nil
}

// seconds is the callback's own time as sent: 0 (the sidecar's provider_timeout_s) when not given.
func (a asked) seconds() (float64, error) {
	if !a.given {
		return 0, nil
	}
	if a.timeout <= 0 {
		return 0, invalid("WithCallbackTimeout wants a positive duration, not %s", a.timeout)
	}
	return a.timeout.Seconds(), nil
}

// static refuses what only a provider takes: a static value is never asked for.
func (a asked) static() error {
	if a.given {
		return invalid("WithCallbackTimeout applies to a provider (a ...Func registration), not to a static value")
	}
	if a.policy != nil {
		return invalid("WithFailurePolicy applies to a provider (a ...Func registration), not to a static value")
	}
	if a.cache != nil {
		return invalid("WithCache applies to a provider (a ...Func registration), not to a static value")
	}
	return nil
}

// sent is the callback's own time and failure policy as sent, or why they are refused.
func (a asked) sent() (float64, pb.FailurePolicy, error) {
	seconds, err := a.seconds()
	if err != nil {
		return 0, 0, err
	}
	policy, err := a.failurePolicy()
	return seconds, policy, err
}

// dynamic is the Dynamic of a provider asked as opts say; nothing is kept when they are refused.
func (r *registrar) dynamic(provider any, a asked) (*pb.Dynamic, error) {
	seconds, policy, err := a.sent()
	if err != nil {
		return nil, err
	}
	cache, err := a.cachePolicy()
	if err != nil {
		return nil, err
	}
	if _, tools := provider.(ToolsFunc); a.name != "" && !tools {
		return nil, invalid("ToolsName applies to ToolsFunc; a section, context or variable is named by its name")
	}
	return &pb.Dynamic{ProviderKey: r.c.providers.add(provider), TimeoutS: seconds, FailurePolicy: policy, Cache: cache}, nil
}

func providerAsked(opts []ProviderOption) asked {
	var a asked
	for _, opt := range opts {
		opt.applyProvider(&a)
	}
	return a
}

// sectionFlag is a SectionOption that sets a field of the request.
type sectionFlag func(*pb.RegisterSectionRequest)

func (f sectionFlag) applySection(request *pb.RegisterSectionRequest, _ *asked) { f(request) }

// listenerFlag is a ListenerOption that sets a field of ListenStart.
type listenerFlag func(*pb.ListenStart)

func (f listenerFlag) applyListener(start *pb.ListenStart, _ *asked) { f(start) }
