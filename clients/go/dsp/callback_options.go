package dsp

import (
	"time"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// Options of a registration besides its value. One option, WithCallbackTimeout,
// fits every registration with a callback, so the option types are interfaces
// (sealed: their methods are unexported) that each option implements where it fits.

// SectionOption configures a section: Complete, and for SectionFunc WithCallbackTimeout.
type SectionOption interface {
	applySection(request *pb.RegisterSectionRequest, asked *asked)
}

// ProviderOption configures ContextFunc, VariableFunc and ToolsFunc: WithCallbackTimeout.
type ProviderOption interface {
	applyProvider(asked *asked)
}

// ListenerOption places a listener in the waterfall (Prepend, Global,
// ListenerName) or gives it its own time (WithCallbackTimeout).
type ListenerOption interface {
	applyListener(start *pb.ListenStart, asked *asked)
}

// CallbackOption is an option of every callback: a provider's (the ...Func
// registrations) and a listener's.
type CallbackOption struct {
	timeout time.Duration
}

// WithCallbackTimeout gives a provider or listener d to answer, instead of the
// sidecar's provider_timeout_s (up to its max_callback_timeout_s; past it the
// registration fails INVALID_ARGUMENT / VALUE_TOO_LARGE): an honest slow
// callback says so instead of being ejected (docs/protocol.md, "Ejected
// callbacks"). For a listener, d bounds each of its replies. d must be positive;
// a static section refuses it (INVALID_VALUE), as it is never asked for.
func WithCallbackTimeout(d time.Duration) CallbackOption { return CallbackOption{timeout: d} }

func (o CallbackOption) applySection(_ *pb.RegisterSectionRequest, a *asked) { a.set(o.timeout) }
func (o CallbackOption) applyProvider(a *asked)                              { a.set(o.timeout) }
func (o CallbackOption) applyListener(_ *pb.ListenStart, a *asked)           { a.set(o.timeout) }

// asked is how a callback is asked, as its options say.
type asked struct {
	timeout time.Duration
	given   bool // WithCallbackTimeout was passed
}

func (a *asked) set(timeout time.Duration) { a.timeout, a.given = timeout, true }

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
	return nil
}

// dynamic is the Dynamic of a provider asked as opts say; nothing is kept when they are refused.
func (r *registrar) dynamic(provider any, a asked) (*pb.Dynamic, error) {
	seconds, err := a.seconds()
	if err != nil {
		return nil, err
	}
	return &pb.Dynamic{ProviderKey: r.c.providers.add(provider), TimeoutS: seconds}, nil
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
