// Ejected callbacks come back: an ejected provider or listener made again after a backoff.

package dsp

import (
	"context"
	"time"
)

// Ejected callbacks come back (docs/protocol.md, "Ejected callbacks"). The
// sidecar ejects a provider or listener that did not answer within its time: it
// disposes it and says so on the owner's stream (CallbackEjected). This client
// then makes the same registration again on the same session (a listener on a
// new stream), after a backoff that doubles with each ejection of it, so the
// handle the agent holds stays valid and a callback stuck for good costs the
// sidecar one timeout per backoff, not one per assembly.

const (
	firstEjectBackoff = time.Second
	maxEjectBackoff   = 30 * time.Second
	ejectCalm         = time.Minute // an ejection this long after the last one starts the backoff again
)

// ejectBackoff is how long the n-th ejection in a row (from 1) waits.
func ejectBackoff(n int) time.Duration {
	delay := firstEjectBackoff
	for i := 1; i < n && delay < maxEjectBackoff; i++ {
		delay *= 2
	}
	return shorter(delay, maxEjectBackoff)
}

// providerEjected hears on s that the sidecar ejected the provider registered as id.
func (c *conn) providerEjected(s *session, id, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.session != s || id == "" {
		return // a lost session's: the replay makes everything again
	}
	for _, r := range c.regs {
		if r.id == id {
			c.scheduleReinstall(r, s.id, why)
			return
		}
	}
}

// listenerEjected hears that the sidecar ejected r's listener, made on
// sessionID, and ended its stream.
func (c *conn) listenerEjected(r *registration, sessionID, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, other := range c.regs {
		if other == r {
			c.scheduleReinstall(r, sessionID, why)
			return
		}
	}
}

// scheduleReinstall makes r again on sessionID after its backoff; c.mu is held.
func (c *conn) scheduleReinstall(r *registration, sessionID, why string) {
	if c.closed || r.reinstall != nil {
		return
	}
	now := time.Now()
	if now.Sub(r.lastEjected) > ejectCalm {
		r.ejections = 0
	}
	r.ejections++
	r.lastEjected = now
	c.background.Add(1) // close waits for a re-install under way
	wait := &reinstallWait{}
	backoff := ejectBackoff(r.ejections)
	c.log.Warn("dsp: the sidecar ejected a callback; registering it again after a backoff",
		"registration", r.id, "why", why, "backoff", backoff)
	wait.timer = time.AfterFunc(backoff, func() {
		defer c.background.Done()
		c.reinstall(r, wait, sessionID)
	})
	r.reinstall = wait
}

// reinstallWait is one re-install waiting for its backoff.
type reinstallWait struct {
	timer *time.Timer // guarded by conn.mu
}

// cancelReinstall drops r's re-install if it is still waiting; c.mu is held.
func (c *conn) cancelReinstall(r *registration) {
	if r.reinstall != nil && r.reinstall.timer.Stop() {
		c.background.Done() // it never runs
	}
	r.reinstall = nil
}

// reinstall makes r again on sessionID once its backoff is over. After a
// reconnect the replay made it already; a disposed one is not made again.
func (c *conn) reinstall(r *registration, wait *reinstallWait, sessionID string) {
	c.ops.Lock() // a disposal or a replay under way finishes first
	defer c.ops.Unlock()
	c.mu.Lock()
	if r.reinstall != wait {
		c.mu.Unlock()
		return // disposed (or closed) meanwhile
	}
	r.reinstall = nil
	held := false
	for _, other := range c.regs {
		held = held || other == r
	}
	if !held || c.closed || !c.connected || c.session.id != sessionID {
		c.mu.Unlock()
		return
	}
	if r.stream != nil {
		r.stream.close() // an ejected listener's stream has ended
		r.stream = nil
	}
	c.mu.Unlock()
	ctx, cancel := bounded(context.Background(), c.callTimeout)
	defer cancel()
	err := c.make(ctx, r, sessionID)
	if err != nil {
		c.log.Warn("dsp: could not register an ejected callback again", "error", err.Error())
	}
	if isNoAnswer(err) {
		c.restart() // it may be registered there: a new session makes it once
	}
	// Any other refusal leaves it out until the next replay, as an ejection does.
}
