// detached: a context with its parent's values and none of its cancellation (Go 1.21's context.WithoutCancel).

package dsp

import (
	"context"
	"time"
)

// detached is its parent's values without its deadline or cancellation: what
// must run to its end whatever the caller's ctx does (a disposal) keeps the
// caller's values (tracing metadata) and is bounded by its own timeout alone.
// Go 1.19, the toolchain here, has no context.WithoutCancel.
type detached struct{ parent context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Done() <-chan struct{}       { return nil }
func (detached) Err() error                  { return nil }
func (d detached) Value(key any) any         { return d.parent.Value(key) }
func (d detached) String() string            { return "detached" }
