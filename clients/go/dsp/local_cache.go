// WithLocalCache: Assemble of a scope whose plan the sidecar marks cacheable answers
// from a copy kept here, checked against this client's own change stream.

package dsp

import (
	"context"
	"errors"
	"io"
	"sync"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/protobuf/encoding/protowire"
)

// The local cache (Python's connect(local_cache=True); docs/protocol.md, "The
// local cache"). An answer is kept under (scope, fields) with the registry
// revision it was taken at, and served while no later revision is known. Later
// revisions come from the cache's own change stream (every change, of every
// scope) and from the replies to this client's own registrations, updates and
// disposals (read-your-writes). While the change stream is broken, and after a
// resync, nothing kept before is served: a break may hide changes, and a
// restarted sidecar's revisions start again.

// localCacheEntries bounds the (scope, fields) pairs kept; a revision change
// makes them all unservable, so when full they are all dropped.
const localCacheEntries = 256

// WithLocalCache keeps the answers of Assemble (without WithReport) for scopes
// whose plan the sidecar marks cacheable (every part static, no listener) and
// answers a repeated Assemble from a copy, without a call, for as long as no
// later registry revision is known: this client's own registrations, updates
// and disposals are seen by its next Assemble, other clients' changes once its
// change stream (opened by Connect, closed with the client) brings them. While
// the stream is broken or the connection is down, and after a resync, every
// Assemble is a call. Render is always a call.
func WithLocalCache() Option { return func(o *options) { o.localCache = true } }

// localKey is what an answer is kept under: the scope and the fields as sent.
type localKey struct{ scope, fields string }

func localKeyOf(request *pb.AssembleRequest) localKey {
	return localKey{request.GetContext().GetScope(), request.GetContext().GetFieldsJson()}
}

type localEntry struct {
	revision uint64
	assembly *Assembly // never handed out: copies are
}

// localCache is one client's kept answers; nil without WithLocalCache (its methods take nil).
type localCache struct {
	changes *ChangeStream
	log     Logger

	mu      sync.Mutex
	entries map[localKey]localEntry
	known   uint64 // the latest revision this client knows of
	epoch   uint64 // moves whenever what is known may have been lost
	live    bool   // the change stream is subscribed
}

// keepLocally gives client its local cache, subscribed to every change within ctx.
func keepLocally(ctx context.Context, client *Client, log Logger) error {
	changes, err := client.WatchChanges(ctx)
	if err != nil {
		return err
	}
	l := &localCache{changes: changes, log: log, entries: map[localKey]localEntry{}, known: changes.Revision, live: true}
	changes.onBreak, changes.onResume = l.broke, l.resumed
	client.c.local = l
	go l.follow()
	return nil
}

// get is a copy of the answer kept for key while it is the registry's, else nil.
func (l *localCache) get(key localKey, connected bool) *Assembly {
	l.mu.Lock()
	defer l.mu.Unlock()
	entry, ok := l.entries[key]
	if !ok || !l.live || !connected || entry.revision < l.known {
		return nil
	}
	return copyAssembly(entry.assembly)
}

// now is the epoch an Assemble starts in: put keeps its answer only if it has not moved.
func (l *localCache) now() uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch
}

// put keeps reply, asked for at epoch, unless something was lost since or a later change is known.
func (l *localCache) put(epoch uint64, key localKey, reply *assembleReply) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !reply.cacheable || epoch != l.epoch || !l.live || reply.revision < l.known {
		return
	}
	if _, held := l.entries[key]; !held && len(l.entries) >= localCacheEntries {
		l.entries = map[localKey]localEntry{} // they share one revision: most are about to go anyway
	}
	l.entries[key] = localEntry{revision: reply.revision, assembly: copyAssembly(reply.assembly)}
}

// wrote hears that this client changed the registry, its reply saying revision (0: not said).
func (c *conn) wrote(revision uint64) {
	l := c.local
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if revision == 0 {
		l.drop()
	} else if revision > l.known {
		l.known = revision
	}
}

// drop forgets every answer, and any answer asked for before now; l.mu is held.
func (l *localCache) drop() {
	l.entries = map[localKey]localEntry{}
	l.epoch++
}

// broke hears that the change stream broke: changes may pass unseen until it resumes.
func (l *localCache) broke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.live = false
	l.drop()
}

// resumed hears that the change stream is subscribed again (its replay, or a resync, follows).
func (l *localCache) resumed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop()
	l.known = l.changes.LastRevision()
	l.live = true
}

// follow reads the change stream, each change moving what is known, until it ends.
func (l *localCache) follow() {
	for {
		change, err := l.changes.Next(context.Background())
		if err != nil {
			if !errors.Is(err, io.EOF) {
				l.log.Warn("dsp: local cache off: its change stream ended", "error", err.Error())
			}
			l.mu.Lock()
			l.live = false
			l.drop()
			l.mu.Unlock()
			return
		}
		l.mu.Lock()
		if _, resynced := change.(ChangesResynced); resynced {
			l.drop() // another incarnation's revisions, or a gap
		}
		if last := l.changes.LastRevision(); last > l.known {
			l.known = last
		}
		l.mu.Unlock()
	}
}

// copyAssembly is a copy of a the caller may change freely.
func copyAssembly(a *Assembly) *Assembly {
	out := &Assembly{
		Sections:  append([]Part{}, a.Sections...),
		Contexts:  append([]Part{}, a.Contexts...),
		Tools:     append([]ToolSchema{}, a.Tools...),
		Variables: make([]Variable, len(a.Variables)),
	}
	for i, v := range a.Variables {
		out.Variables[i] = Variable{Name: v.Name}
		if v.Value != nil {
			value := *v.Value
			out.Variables[i].Value = &value
		}
	}
	return out
}

// replyScalars reads an AssembleResponse's revision (3) and cacheable (5), the
// varints the reply's decoder passes over.
func replyScalars(data []byte) (revision uint64, cacheable bool) {
	for len(data) > 0 {
		number, kind, n := protowire.ConsumeTag(data)
		if n < 0 {
			return 0, false
		}
		data = data[n:]
		if kind == protowire.VarintType && (number == 3 || number == 5) {
			value, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return 0, false
			}
			if number == 3 {
				revision = value
			} else {
				cacheable = value != 0
			}
			data = data[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(number, kind, data)
		if m < 0 {
			return 0, false
		}
		data = data[m:]
	}
	return revision, cacheable
}
