// Package dsp is the Go client of the dsh-system-prompt sidecar: agent
// processes register prompt sections, runtime contexts, tool schemas and
// variables through a session, install waterfall listeners, watch changes, and
// ask the sidecar for the assembled (and rendered) prompt.
//
// Connect opens a session; everything registered through it is disposed when
// it is closed or lost. Static values are stored in the sidecar; the ...Func
// registrations keep their provider in this process, and the sidecar asks for
// its value at every assembly that needs it, with a context.Context that ends
// when the sidecar stops waiting. After a sidecar restart the client reconnects
// and makes every registration again, in order; a provider or listener the
// sidecar ejected for not answering in time is made again after a backoff (the
// change event of its disposal says why, in ChangeEvent.Reason). Each provider's
// value is sent as soon as it returns, so only the one that was late is blamed,
// never the session's others asked with it.
//
// A provider or listener made WithCache (CacheRevision, CacheFields, CacheTTL)
// may be answered by the sidecar from what it answered before, until the
// registry changes or its Registration.Invalidate; ToolsName labels a tool
// provider in errors and change events.
//
// Rule registers a rule: a waterfall step the sidecar runs itself, in CEL, with
// no hop (Rule, the Mutation constructors DropTools, KeepTools, OrderTools,
// UpsertSections, DropSections, UpsertContexts, DropContexts and SetVariables,
// RulePart; docs/protocol.md, "Rules"); its handle's Update replaces what it does.
//
// WithLocalCache answers a repeated Assemble of a cacheable scope (or of a
// rules-only one, with the same fields) from a copy kept in this process until a
// change of a layer it read is known (a scoped agent's cache watches each scope it
// assembles).
//
// WithLogger hands what the client does on its own (a lost session, each
// reconnect attempt and replay, an ejected callback made again) to a Logger,
// which a *slog.Logger satisfies.
//
// Every failure is an *Error carrying the gRPC code, the stable Reason (one
// constant per value of the proto's enum, as for ChangeKind, ChangeAction,
// PartKind and SourceKind) and the sidecar's message; a call its ctx ended, any
// call, is also errors.Is(err, context.Canceled) or
// errors.Is(err, context.DeadlineExceeded). Register makes a run of
// registrations checked once; Text, FieldVariable and Schemas are the common
// provider shapes. The wire contract is proto/dsh/systemprompt/v1 of the
// repository; docs/protocol.md describes what this package implements.
package dsp
