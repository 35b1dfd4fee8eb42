// Listings of the registry: Snapshot, filtered like WatchChanges.

package dsp

import (
	"context"
	"errors"
	"io"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// Listings: the registrations at one revision, as Snapshot and a change
// stream's resync give them.

// Snapshot is the registrations at one revision.
type Snapshot struct {
	Revision      uint64
	Incarnation   string
	Registrations []RegistrationInfo
}

// RegistrationInfo is one registration as a listing shows it.
type RegistrationInfo struct {
	Ref   string
	Kind  ChangeKind
	Name  string
	Scope string
	// Order is a section's or context's order.
	Order      *float64
	Complete   bool
	Dynamic    bool
	Owner      string
	OwnerLabel string
	SizeBytes  uint64
	// Fingerprint is 16 hex digits of HMAC-SHA256 of the static value, keyed for
	// the sidecar's incarnation: equal values print alike until it restarts.
	Fingerprint string
	// Text is a static text or variable value, with WithValues.
	Text *string
	// Tools is a static tool list, with WithValues.
	Tools *ToolProviderResult
	// Rule is a rule's definition, with WithValues.
	Rule *Rule
	// Global says it is a listener or rule that runs for every scope's
	// assemblies (registered with Global, or in the global layer).
	Global bool
}

// Snapshot lists the registrations now, filtered like WatchChanges.
func (c *Client) Snapshot(ctx context.Context, opts ...WatchOption) (*Snapshot, error) {
	if _, err := c.c.ready(ctx); err != nil {
		return nil, err
	}
	o := collect(opts)
	return c.c.list(ctx, &pb.ListRegistrationsRequest{Filter: &o.filter, IncludeValues: o.values})
}

func (c *conn) list(ctx context.Context, request *pb.ListRegistrationsRequest) (*Snapshot, error) {
	call, err := c.rpc.ListRegistrations(ctx, request)
	if err != nil {
		return nil, callError(ctx, err)
	}
	snapshot := &Snapshot{}
	for {
		batch, err := call.Recv()
		if errors.Is(err, io.EOF) {
			return snapshot, nil
		}
		if err != nil {
			return nil, callError(ctx, err)
		}
		snapshot.Revision, snapshot.Incarnation = batch.GetRevision(), batch.GetIncarnation()
		for _, m := range batch.GetRegistrations() {
			snapshot.Registrations = append(snapshot.Registrations, registrationFromProto(m))
		}
	}
}

func registrationFromProto(m *pb.RegistrationInfo) RegistrationInfo {
	info := RegistrationInfo{
		Ref: m.GetRef(), Kind: kindFromProto(m.GetKind()), Name: m.GetName(), Scope: m.GetScope(),
		Order: m.Order, Complete: m.GetComplete(), Dynamic: m.GetDynamic(), Owner: m.GetOwner(),
		OwnerLabel: m.GetOwnerLabel(), SizeBytes: m.GetSizeBytes(), Fingerprint: m.GetFingerprint(),
		Global: m.GetGlobal(),
	}
	switch value := m.GetValue().GetValue().(type) {
	case *pb.RegisteredValue_Text:
		info.Text = &value.Text
	case *pb.RegisteredValue_Tools:
		tools := ToolProviderResult{Schemas: toolsFromProto(value.Tools.GetSchemas())}
		if value.Tools.KnownNames != nil {
			tools.KnownNames = value.Tools.KnownNames.GetNames()
		}
		info.Tools = &tools
	case *pb.RegisteredValue_Rule:
		rule := ruleFromProto(value.Rule)
		info.Rule = &rule
	}
	return info
}
