// Registration and Handle: what a registration returns, to update or dispose it.

package dsp

import (
	"context"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// The handles a registration returns: Registration disposes it, Handle also
// replaces a static value in place.

// Registration disposes one registration.
type Registration struct {
	c        *conn
	r        *registration
	disposed bool
}

// Dispose removes the registration; calling it again does nothing. It runs to
// its end, within the client's call timeout, whatever ctx does: a ctx cancelled
// or past its deadline (a listener's own invocation's, say) neither cuts it
// short nor leaves the registration on the sidecar; ctx's values go with its calls.
func (d *Registration) Dispose(ctx context.Context) error {
	d.c.ops.Lock()
	done := d.disposed
	d.disposed = true
	d.c.ops.Unlock()
	if done {
		return nil
	}
	return d.c.dispose(ctx, d.r)
}

// Handle disposes one registration and replaces its static value in place.
type Handle[V any] struct {
	Registration
	update func(V) (*pb.UpdateRequest, func(), error)
}

// Update replaces the value; other clients' assemblies see the old value or
// the new one, never neither, and watchers get one UPDATED event. After a
// reconnect the latest value is what is registered again. A registration
// made with a provider is NOT_UPDATABLE. It returns the registry's revision.
func (h *Handle[V]) Update(ctx context.Context, value V) (uint64, error) {
	request, apply, err := h.update(value)
	if err != nil {
		return 0, err
	}
	return h.c.update(ctx, h.r, request, apply)
}

// textUpdate updates a section's or context's text or a variable's value,
// written into the registration request by set (nil: a provider's registration).
func textUpdate(set func(string)) func(string) (*pb.UpdateRequest, func(), error) {
	return func(text string) (*pb.UpdateRequest, func(), error) {
		apply := func() {
			if set != nil {
				set(text)
			}
		}
		return &pb.UpdateRequest{Value: &pb.UpdateRequest_Text{Text: text}}, apply, nil
	}
}
