// WithLocalCache: Assemble of a scope whose plan the sidecar marks cacheable (or
// cacheable_with_fields, for the same fields) answers from a copy kept here, checked
// against this client's own change stream.

package dsp

import (
	"context"
	"errors"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
)

// The local cache (Python's connect(local_cache=True); docs/protocol.md, "The
// local cache"). A cacheable plan's answer is kept under its scope alone (it is
// all-static: the fields change nothing), a cacheable_with_fields plan's (its only
// non-static steps are rules, which read only the assembly, the fields and the
// scope) under its scope and the request's very fields_json; each with what it read
// (the asked key, the reply's scope_chain, the global layer) and their revision
// (cache_revision). It is
// served until a change event of one of those layers comes with a later revision,
// or one that re-bound a key of its chain (ReboundScopes), or one the sidecar marks
// Global (the global layer's, or a listener or rule that runs everywhere), so
// another scope's change, a step registered on another scope among them, leaves it
// in place; from a sidecar that does not say Global any listener or rule event
// counts, and a sidecar that sends no cache_revision is one where every change
// counts. Changes come from a change
// stream: one of every change when the credential may watch every layer, else
// (PERMISSION_DENIED: an agent that lists its own scopes) one per scope assembled,
// filtered to that scope's chain (its layer, its ancestors', the global one), at
// most localScopeWatches of them; and from the replies to this client's own
// registrations, updates and disposals (read-your-writes). While a stream is
// broken, and after a resync or a gap, nothing it covers is served or kept. What
// is kept is bounded by WithLocalCacheBytes, least recently used first.

// localCacheEntries bounds the answers kept (a scope's, or a scope's for some fields).
const localCacheEntries = 256

// LocalCacheBytes is WithLocalCacheBytes' default: 32 MiB of kept texts.
const LocalCacheBytes = 32 << 20

// localRecent bounds the change events remembered for answers in flight while they came.
const localRecent = 1024

// localScopeWatches bounds the change streams of one scope each, for a credential listing scopes.
const localScopeWatches = 16

// localRefused bounds the scopes whose watch was refused, not asked again (then forgotten).
const localRefused = 1024

// WithLocalCache keeps the answers of Assemble (without WithReport) for scopes
// whose plan the sidecar marks cacheable (every part static, no listener) and
// answers a repeated Assemble of the scope (whatever its fields) from a copy,
// without a call; a plan whose only non-static steps are rules
// (cacheable_with_fields) is kept the same way under its scope and the very fields
// asked with (WithFields' JSON, byte for byte), each value its own answer. Both are
// kept until a change of a layer they read is known: this client's own
// registrations, updates and disposals are seen by its next Assemble, other
// clients' changes once its change stream (opened by Connect, closed with the
// client) brings them; a change in another scope leaves it. A credential that may
// not watch every change (an agent listing its own scopes) gets a watch of each
// scope it assembles instead (up to 16), opened in the background by the scope's
// first Assemble and filtered to its chain: the scope's answers are kept from then
// on. While a stream is broken or the connection is down, and after a resync,
// every Assemble of what it covers is a call. Render is always a call.
func WithLocalCache() Option { return func(o *options) { o.localCache = true } }

// WithLocalCacheBytes bounds what WithLocalCache keeps: its answers' texts, in
// bytes (LocalCacheBytes by default); the least recently used go first, and an
// answer larger than the whole budget is not kept. Anything below 1 is the default.
func WithLocalCacheBytes(n int) Option { return func(o *options) { o.localCacheBytes = n } }

// localKey is what an answer is kept under: its scope as sent, and for a rules-only
// plan's (withFields) the request's fields_json; a static plan's is the same for any fields.
type localKey struct {
	scope, fields string
	withFields    bool
}

type localEntry struct {
	revision uint64              // of what it read (an older sidecar's: the registry's)
	reads    map[string]struct{} // the scope keys it read; nil: every change concerns it
	assembly *Assembly           // never handed out: copies are
	watch    *localWatch         // the change stream that tells when it goes
	size     int
	used     uint64 // when last used, for the least recently used to go first
}

// concerned tells whether a change of layers (every: any layer) at revision makes e stale.
func (e localEntry) concerned(layers []string, every bool, revision uint64) bool {
	if revision <= e.revision {
		return false // it is in the answer already
	}
	if every || e.reads == nil {
		return true
	}
	for _, layer := range layers {
		if _, read := e.reads[layer]; read {
			return true
		}
	}
	return false
}

type seenChange struct {
	sequence, revision uint64
	layers             []string
	every              bool
}

// localTicket is taken before an Assemble call: what its answer is kept against.
type localTicket struct {
	epoch, sequence uint64
	watch           *localWatch // nil: the answer is not kept
	watchEpoch      uint64      // the watch's: moves when it broke, resynced or missed events
}

// localWatch is one change stream the cache follows: of every layer (every), or of
// one scope's chain; its fields are the cache's, under its mu.
type localWatch struct {
	scope string
	every bool
	live  bool   // subscribed, and not broken since
	epoch uint64 // moves whenever it may have missed changes
}

// localCache is one client's kept answers; nil without WithLocalCache (its methods take nil).
type localCache struct {
	client   *Client
	log      Logger
	maxBytes int

	mu       sync.Mutex
	entries  map[localKey]localEntry
	bytes    int
	uses     uint64
	recent   []seenChange           // the last localRecent changes seen, oldest first
	sequence uint64                 // changes seen (and own writes)
	epoch    uint64                 // moves whenever every answer is dropped
	every    *localWatch            // the stream of every change, when allowed
	scoped   map[string]*localWatch // else one per scope
	refused  map[string]struct{}    // scopes whose watch was refused
}

// keepLocally gives client its local cache, subscribed within ctx to every change,
// or, when its credential may not, ready to watch each scope it assembles.
func keepLocally(ctx context.Context, client *Client, log Logger, maxBytes int) error {
	if maxBytes < 1 {
		maxBytes = LocalCacheBytes
	}
	l := &localCache{client: client, log: log, maxBytes: maxBytes, entries: map[localKey]localEntry{},
		scoped: map[string]*localWatch{}, refused: map[string]struct{}{}}
	changes, err := client.WatchChanges(ctx)
	var failed *Error
	switch {
	case err == nil:
		l.every = &localWatch{every: true, live: true}
		l.follow(l.every, changes)
	case errors.As(err, &failed) && failed.Code == codes.PermissionDenied:
		// an agent listing its own scopes: each scope assembled is watched instead
	default:
		return err
	}
	client.c.local = l
	return nil
}

// get is a copy of the answer kept for scope (a static plan's) or for scope with
// these very fields (a rules-only plan's) while it is the registry's, else nil.
func (l *localCache) get(scope, fields string, connected bool) *Assembly {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !connected {
		return nil
	}
	for _, key := range [...]localKey{{scope: scope}, {scope: scope, fields: fields, withFields: true}} {
		entry, ok := l.entries[key]
		if !ok || !entry.watch.live {
			continue
		}
		l.uses++
		entry.used = l.uses
		l.entries[key] = entry
		return copyAssembly(entry.assembly)
	}
	return nil
}

// now is the ticket an Assemble of scope starts with: put keeps its answer only if
// nothing was lost since. No stream covering scope yet: its watch is opened for the next.
func (l *localCache) now(scope string) localTicket {
	if l == nil {
		return localTicket{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	watch := l.watchOf(scope)
	if watch == nil || !watch.live {
		return localTicket{}
	}
	return localTicket{epoch: l.epoch, sequence: l.sequence, watch: watch, watchEpoch: watch.epoch}
}

// watchOf is the stream covering key: the one of every change, else the scope's
// own, opened in the background the first time (none for the global layer alone,
// past localScopeWatches, or where the watch was refused); l.mu is held.
func (l *localCache) watchOf(key string) *localWatch {
	if l.every != nil {
		return l.every
	}
	watch, ok := l.scoped[key]
	if _, refused := l.refused[key]; ok || key == "" || refused || len(l.scoped) >= localScopeWatches {
		return watch
	}
	watch = &localWatch{scope: key}
	l.scoped[key] = watch
	go l.open(watch)
	return watch
}

// open subscribes watch, filtered to its scope's chain, and follows it.
func (l *localCache) open(watch *localWatch) {
	ctx, cancel := bounded(context.Background(), l.client.c.callTimeout)
	defer cancel()
	changes, err := l.client.WatchChanges(ctx, InScope(watch.scope, true))
	if err != nil {
		var failed *Error
		if errors.As(err, &failed) && failed.Code == codes.PermissionDenied {
			l.log.Warn("dsp: local cache off for a scope: its watch was refused", "scope", watch.scope, "error", err.Error())
		}
		l.ended(watch, err)
		return
	}
	l.mu.Lock()
	watch.live = true
	l.mu.Unlock()
	l.follow(watch, changes)
}

// ended hears that watch ended for good, with err: a scope's may be opened again
// later, unless it was refused.
func (l *localCache) ended(watch *localWatch, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	watch.live = false
	l.lost(watch)
	if watch.every || l.scoped[watch.scope] != watch {
		return
	}
	delete(l.scoped, watch.scope)
	var failed *Error
	if errors.As(err, &failed) && failed.Code == codes.PermissionDenied {
		if len(l.refused) >= localRefused {
			l.refused = map[string]struct{}{}
		}
		l.refused[watch.scope] = struct{}{}
	}
}

// put keeps reply, asked for with ticket, unless something was lost or overtook it
// since: under scope when it is cacheable, under scope and fields when it is
// cacheable_with_fields, else not at all.
func (l *localCache) put(ticket localTicket, scope, fields string, reply *assembleReply) {
	key := localKey{scope: scope}
	switch {
	case reply.cacheable:
	case reply.cacheableWithFields:
		key.fields, key.withFields = fields, true
	default:
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	watch := ticket.watch
	if ticket.epoch != l.epoch || watch == nil || !watch.live || ticket.watchEpoch != watch.epoch {
		return
	}
	entry := localEntry{revision: reply.revision, assembly: copyAssembly(reply.assembly), watch: watch,
		size: assemblyBytes(reply.assembly) + len(key.scope) + len(key.fields)}
	if reply.cacheRevision != 0 {
		entry.revision = reply.cacheRevision
		entry.reads = map[string]struct{}{scope: {}}
		for _, scope := range reply.scopeChain {
			entry.reads[scope] = struct{}{}
		}
	}
	if entry.size > l.maxBytes || l.overtaken(entry, ticket.sequence) {
		return
	}
	l.remove(key)
	l.uses++
	entry.used = l.uses
	l.entries[key] = entry
	l.bytes += entry.size
	for l.bytes > l.maxBytes || len(l.entries) > localCacheEntries {
		l.remove(l.leastUsed())
	}
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
	} else {
		l.seen(nil, true, revision) // its layer unknown here: any
	}
}

// seen hears of a change of layer (every: of any) at revision; l.mu is held.
func (l *localCache) seen(layers []string, every bool, revision uint64) {
	l.sequence++
	l.recent = append(l.recent, seenChange{l.sequence, revision, layers, every})
	if len(l.recent) > localRecent {
		l.recent = append(l.recent[:0], l.recent[len(l.recent)-localRecent:]...)
	}
	for key, entry := range l.entries {
		if entry.concerned(layers, every, revision) {
			l.remove(key)
		}
	}
}

// overtaken tells whether a change seen since sequence (while the answer was on its
// way) makes entry stale, or too many came to tell; l.mu is held.
func (l *localCache) overtaken(entry localEntry, sequence uint64) bool {
	if l.sequence == sequence {
		return false
	}
	if len(l.recent) == 0 || l.recent[0].sequence > sequence+1 {
		return true // some have been forgotten
	}
	for _, change := range l.recent {
		if change.sequence > sequence && entry.concerned(change.layers, change.every, change.revision) {
			return true
		}
	}
	return false
}

func (l *localCache) leastUsed() localKey {
	oldest, first := localKey{}, true
	for key, entry := range l.entries {
		if first || entry.used < l.entries[oldest].used {
			oldest, first = key, false
		}
	}
	return oldest
}

func (l *localCache) remove(key localKey) {
	if entry, ok := l.entries[key]; ok {
		delete(l.entries, key)
		l.bytes -= entry.size
	}
}

// drop forgets every answer, and any answer asked for before now; l.mu is held.
func (l *localCache) drop() {
	l.entries = map[localKey]localEntry{}
	l.bytes = 0
	l.epoch++
}

// lost hears that watch may have missed changes: what it covers goes; l.mu is held.
func (l *localCache) lost(watch *localWatch) {
	watch.epoch++
	for key, entry := range l.entries {
		if entry.watch == watch {
			l.remove(key)
		}
	}
}

// follow reads changes in the background until they end, each change dropping the
// answers that read its layer, a break, a resync or a gap those watch covers.
func (l *localCache) follow(watch *localWatch, changes *ChangeStream) {
	changes.onBreak = func() { // changes may pass unseen until it resumes
		l.mu.Lock()
		defer l.mu.Unlock()
		watch.live = false
		l.lost(watch)
	}
	changes.onResume = func() { // its replay, or a resync, follows
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lost(watch)
		watch.live = true
	}
	go func() {
		for {
			change, err := changes.Next(context.Background())
			if err != nil {
				if !errors.Is(err, io.EOF) {
					if watch.every {
						l.log.Warn("dsp: local cache off: its change stream ended", "error", err.Error())
					} else {
						l.log.Warn("dsp: local cache off for a scope: its change stream ended", "scope", watch.scope, "error", err.Error())
					}
				}
				l.ended(watch, err)
				return
			}
			l.mu.Lock()
			switch change := change.(type) {
			case ChangeEvent:
				every := change.Scope == "" || concernsEveryScope(change)
				l.seen(append([]string{change.Scope}, change.ReboundScopes...), every, change.Revision)
			default:
				l.lost(watch) // a resync (another incarnation's revisions) or a gap
			}
			l.mu.Unlock()
		}
	}()
}

// concernsEveryScope tells whether change is marked global by the sidecar; from
// one that does not say, whether it is a listener's or rule's (it may run everywhere).
func concernsEveryScope(change ChangeEvent) bool {
	if change.Global != nil {
		return *change.Global
	}
	return change.Kind == ChangeKindListener || change.Kind == ChangeKindRule
}

// assemblyBytes is what an assembly's texts take.
func assemblyBytes(a *Assembly) int {
	size := 0
	for _, parts := range [][]Part{a.Sections, a.Contexts} {
		for _, part := range parts {
			size += len(part.Name) + len(part.Text)
		}
	}
	for _, tool := range a.Tools {
		size += len(tool.Name) + len(tool.Description) + len(tool.ParametersJSON)
	}
	for _, v := range a.Variables {
		size += len(v.Name)
		if v.Value != nil {
			size += len(*v.Value)
		}
	}
	return size
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

// replyScalars are an AssembleResponse's varints, which the reply's decoder passes over.
type replyScalars struct {
	revision            uint64 // 3: the registry's revision the assembly was taken at
	cacheable           bool   // 5: the same answer for any fields until a layer it read changes
	cacheRevision       uint64 // 7: the revision of what it read (0: an older sidecar)
	cacheableWithFields bool   // 9: the same answer for these very fields (a rules-only plan)
}

// readScalars reads data's replyScalars (none from malformed bytes).
func readScalars(data []byte) replyScalars {
	var s replyScalars
	for len(data) > 0 {
		number, kind, n := protowire.ConsumeTag(data)
		if n < 0 {
			return replyScalars{}
		}
		data = data[n:]
		if kind == protowire.VarintType && (number == 3 || number == 5 || number == 7 || number == 9) {
			value, m := protowire.ConsumeVarint(data)
			if m < 0 {
				return replyScalars{}
			}
			switch number {
			case 3:
				s.revision = value
			case 5:
				s.cacheable = value != 0
			case 7:
				s.cacheRevision = value
			default:
				s.cacheableWithFields = value != 0
			}
			data = data[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(number, kind, data)
		if m < 0 {
			return replyScalars{}
		}
		data = data[m:]
	}
	return s
}
