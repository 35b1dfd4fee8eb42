// The prompt-cache report: WithReport, WithReportKey, WithPrefixLayout, WithToolFreeze and the report's values.

package dsp

import (
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// PrefixLayout is the order in which a model server lays out the cached prefix
// of a request (docs/prompt-cache.md, "The prefix layout").
type PrefixLayout string

const (
	// PrefixLayoutSystemFirst is the system prompt, then the tools block:
	// DeepSeek's chat templates (the sidecar's default).
	PrefixLayoutSystemFirst PrefixLayout = "system-first"
	// PrefixLayoutToolsFirst is the tools, then the system prompt: Anthropic's
	// cache order, and OpenAI-style requests.
	PrefixLayoutToolsFirst PrefixLayout = "tools-first"
)

// layoutToProto is the wire's value of layout; false for a layout this package does not know.
func layoutToProto(layout PrefixLayout) (pb.PrefixLayout, bool) {
	switch layout {
	case PrefixLayoutSystemFirst:
		return pb.PrefixLayout_PREFIX_LAYOUT_SYSTEM_FIRST, true
	case PrefixLayoutToolsFirst:
		return pb.PrefixLayout_PREFIX_LAYOUT_TOOLS_FIRST, true
	}
	return pb.PrefixLayout_PREFIX_LAYOUT_UNSPECIFIED, false
}

// PartKind is what a PartReport describes (the proto's PartKind): one of the
// PartKind constants, or PartKindUnknown for a kind this package does not know
// (a newer sidecar's). A test checks the constants against the enum.
type PartKind string

// The part kinds, one per value of the proto's PartKind.
const (
	PartKindTool    PartKind = "tool"
	PartKindSection PartKind = "section"
	PartKindContext PartKind = "context"
	// PartKindUnknown is a kind this package does not know (a newer sidecar's).
	PartKindUnknown PartKind = "unknown"
)

var partKinds = map[pb.PartKind]PartKind{
	pb.PartKind_PART_KIND_TOOL: PartKindTool, pb.PartKind_PART_KIND_SECTION: PartKindSection,
	pb.PartKind_PART_KIND_CONTEXT: PartKindContext,
}

// SourceKind is where a part came from (the proto's SourceKind): one of the
// SourceKind constants, or SourceKindUnknown for a kind this package does not know.
type SourceKind string

// The source kinds, one per value of the proto's SourceKind.
const (
	// SourceKindBuiltin is a built-in part: the persona, the harness identity.
	SourceKindBuiltin SourceKind = "builtin"
	// SourceKindGlobal is a registration on the global layer.
	SourceKindGlobal SourceKind = "global"
	// SourceKindScope is a registration on a scope's layer (Source.Scope, Source.AncestorDepth).
	SourceKindScope SourceKind = "scope"
	// SourceKindListener is a part a listener added or last changed (Source.Listener).
	SourceKindListener SourceKind = "listener"
	// SourceKindRule is a part a rule added or last changed (the proto's Source.rule).
	SourceKindRule SourceKind = "rule"
	// SourceKindUnknown is a kind this package does not know (a newer sidecar's).
	SourceKindUnknown SourceKind = "unknown"
)

var sourceKinds = map[pb.SourceKind]SourceKind{
	pb.SourceKind_SOURCE_KIND_BUILTIN: SourceKindBuiltin, pb.SourceKind_SOURCE_KIND_GLOBAL: SourceKindGlobal,
	pb.SourceKind_SOURCE_KIND_SCOPE: SourceKindScope, pb.SourceKind_SOURCE_KIND_LISTENER: SourceKindListener,
	pb.SourceKind_SOURCE_KIND_RULE: SourceKindRule,
}

// AssemblyReport is the prompt-cache report of one assembly (WithReport):
// provenance, sizes and prefix stability against the previous reported
// assembly of the same history key (docs/prompt-cache.md).
type AssemblyReport struct {
	// Tokenizer is the tokenizer behind token counts; "" when sizes are bytes only.
	Tokenizer string
	// Parts are every part in model order: the prefix in PrefixLayout, then contexts.
	Parts []PartReport
	// Tools, Prompt and ContextSnapshot are the tool list's, the rendered system
	// prompt's and the rendered runtime-context snapshot's sizes.
	Tools, Prompt, ContextSnapshot Size
	// Stability is the prefix against the previous reported assembly of the key.
	Stability PrefixStability
	// Variables say where each variable came from, in the assembly's order.
	Variables []VariableReport
	// RenderError is why the assembly does not render (naming the part), or "".
	RenderError string
	// PrefixLayout is the layout the prefix was measured in.
	PrefixLayout PrefixLayout
	// HistoryKey is the key compared with, in words: `scope "agent-1"`, `key "conv-7"`.
	HistoryKey string
	// Skipped are the steps the assembly went on without (as WithSkipped's).
	Skipped []SkippedStep
	// ToolOrder is how the tools kept the history key's order; nil unless the
	// sidecar keeps a stable order (config tool_order_mode "stable").
	ToolOrder *ToolOrderReport
}

// ToolOrderReport is a stably ordered assembly's tools against the order
// sorting gave them (docs/prompt-cache.md, "A stable tool order").
type ToolOrderReport struct {
	// Kept is true when the stable order differs from the sorted one; the
	// other fields say where only then.
	Kept bool
	// Position is the first place (0-based, in the tool list) where they differ.
	Position uint32
	// SortedTool is the tool sorting would have put at Position.
	SortedTool string
	// KeptTool is the tool the stable order keeps at Position.
	KeptTool string
}

// Size is a size in UTF-8 bytes and, with a tokenizer, in tokens.
type Size struct {
	Bytes uint64
	// Tokens is nil when the sidecar has no tokenizer configured.
	Tokens *uint64
}

// Source is where an assembled part or a variable's value came from.
type Source struct {
	Kind SourceKind
	// Scope is, for "scope", the scope key whose layer holds the registration.
	Scope string
	// AncestorDepth is, for "scope", 0 for the assembly's own scope, 1 for its parent, ...
	AncestorDepth uint32
	// Listener is, for "listener", the listener that added or last changed the part.
	Listener string
	// Description is the same in words, e.g. `scope "team" (ancestor of "agent-1")`.
	Description string
}

// PartReport is one rendered part of a reported assembly.
type PartReport struct {
	Kind   PartKind
	Name   string
	Source Source
	// Bytes is its size: a tool as {"name","description","parameters"} JSON, a
	// section or context as rendered text.
	Bytes uint64
	// Tokens is nil without a tokenizer.
	Tokens *uint64
	// Fingerprint is 16 hex digits of the SHA-256 of its rendered bytes.
	Fingerprint string
	// Stable is true when it and everything before it are byte-identical to the
	// previous report's (for a context: when it is unchanged).
	Stable bool
}

// PrefixStability is how much of the model-facing prefix stayed the same.
type PrefixStability struct {
	// HasPrevious is false when no earlier report of the key is kept.
	HasPrevious bool
	// StableBytes is the longest common prefix with the previous one, in bytes.
	StableBytes uint64
	// StableTokens is the same in tokens; nil without a tokenizer.
	StableTokens *uint64
	// Prefix is the whole prefix text's size.
	Prefix Size
	// FirstChanged is the first part that changed, e.g. `section "cwd"`; "" when none did.
	FirstChanged string
	// Reason is why, e.g. `section "cwd" text changed (variable {{cwd}} changed)`.
	Reason string
	// Recomputed is what the model server must recompute of the prefix.
	Recomputed Size
	// MessagesRecomputed is true when the prefix broke: every message after it is recomputed too.
	MessagesRecomputed bool
	// Diff is a short -/+ diff of the first changed part's old and new text.
	Diff string
	// PreviousEvicted is true when an earlier report existed but was evicted for other keys.
	PreviousEvicted bool
}

// VariableReport is where one variable's value came from.
type VariableReport struct {
	Name   string
	Source Source
}

// WithReport asks for the prompt-cache report and sets *into to it, as
// WithSkipped hands back the skipped steps. The report compares with the
// previous report of the history key (WithReportKey; default the scope) and
// counts in its history; it renders on the sidecar, so it costs more.
func WithReport(into *AssemblyReport) AssembleOption {
	return func(r *assembleRequest) {
		if into == nil {
			r.err = invalid("WithReport needs an *AssemblyReport to set")
			return
		}
		r.message.Report, r.report = true, into
	}
}

// WithReportKey names the history key a report compares with and counts under,
// e.g. one per conversation; "" is the scope.
func WithReportKey(key string) AssembleOption {
	return func(r *assembleRequest) { r.message.ReportKey = key }
}

// WithPrefixLayout measures the report's prefix in layout instead of the
// sidecar's configured prefix_layout.
func WithPrefixLayout(layout PrefixLayout) AssembleOption {
	return func(r *assembleRequest) {
		r.message.PrefixLayout = layoutOption(layout, &r.err)
	}
}

// ToolFreeze is what a reported assembly does to its history key's tool freeze
// (docs/prompt-cache.md, "Freezing the tools"): WithToolFreeze's value.
type ToolFreeze string

// The tool freezes, one per value of the proto's ToolFreeze.
const (
	// ToolFreezeHold freezes the key's tools as this assembly has them (names,
	// order and bytes), unless frozen already; while frozen, a reported assembly
	// of the key whose tools differ fails FAILED_PRECONDITION, ReasonToolsFrozen.
	ToolFreezeHold ToolFreeze = "hold"
	// ToolFreezeRelease releases the key's freeze before this assembly (e.g. at
	// compaction), which may then change the tools.
	ToolFreezeRelease ToolFreeze = "release"
)

var toolFreezes = map[ToolFreeze]pb.ToolFreeze{
	ToolFreezeHold: pb.ToolFreeze_TOOL_FREEZE_HOLD, ToolFreezeRelease: pb.ToolFreeze_TOOL_FREEZE_RELEASE,
}

// WithToolFreeze holds or releases the report key's tool list (with WithReport:
// the freeze belongs to the key's history, so without a report the sidecar
// refuses it, INVALID_VALUE). While a key is frozen, every reported assembly of
// it is checked, whatever its own freeze.
func WithToolFreeze(freeze ToolFreeze) AssembleOption {
	return func(r *assembleRequest) {
		value, ok := toolFreezes[freeze]
		if !ok {
			r.err = invalid("tool freeze must be %q or %q, not %q", ToolFreezeHold, ToolFreezeRelease, freeze)
		}
		r.message.ToolFreeze = value
	}
}

// layoutOption is layout on the wire; an unknown one sets *failed (an option's error).
func layoutOption(layout PrefixLayout, failed *error) pb.PrefixLayout {
	value, ok := layoutToProto(layout)
	if !ok {
		*failed = invalid("prefix layout must be %q or %q, not %q", PrefixLayoutSystemFirst, PrefixLayoutToolsFirst, layout)
	}
	return value
}

func layoutFromProto(layout pb.PrefixLayout) PrefixLayout {
	if layout == pb.PrefixLayout_PREFIX_LAYOUT_TOOLS_FIRST {
		return PrefixLayoutToolsFirst
	}
	return PrefixLayoutSystemFirst // the wire never says unspecified here
}

func sizeFromProto(m *pb.Size) Size {
	if m == nil {
		return Size{}
	}
	return Size{Bytes: m.GetBytes(), Tokens: optional(m.Tokens)}
}

// optional copies a proto3 optional, so the returned value shares nothing with the message.
func optional(value *uint64) *uint64 {
	if value == nil {
		return nil
	}
	copied := *value
	return &copied
}

func sourceFromProto(m *pb.Source) Source {
	return Source{
		Kind: named(sourceKinds, m.GetKind(), SourceKindUnknown), Scope: m.GetScope(), AncestorDepth: m.GetAncestorDepth(),
		Listener: m.GetListener(), Description: m.GetDescription(),
	}
}

func reportFromProto(m *pb.AssemblyReport) *AssemblyReport {
	s := m.GetStability()
	if s == nil {
		s = &pb.PrefixStability{} // its optional fields are read as fields, not through getters
	}
	report := &AssemblyReport{
		Tokenizer: m.GetTokenizer(), Parts: make([]PartReport, len(m.GetParts())),
		Tools: sizeFromProto(m.GetTools()), Prompt: sizeFromProto(m.GetPrompt()),
		ContextSnapshot: sizeFromProto(m.GetContextSnapshot()),
		Stability: PrefixStability{
			HasPrevious: s.GetHasPrevious(), StableBytes: s.GetStableBytes(), StableTokens: optional(s.StableTokens),
			Prefix: sizeFromProto(s.GetPrefix()), FirstChanged: s.GetFirstChanged(), Reason: s.GetReason(),
			Recomputed: sizeFromProto(s.GetRecomputed()), MessagesRecomputed: s.GetMessagesRecomputed(),
			Diff: s.GetDiff(), PreviousEvicted: s.GetPreviousEvicted(),
		},
		Variables:   make([]VariableReport, len(m.GetVariables())),
		RenderError: m.GetRenderError(), PrefixLayout: layoutFromProto(m.GetPrefixLayout()),
		HistoryKey: m.GetHistoryKey(),
	}
	for i, part := range m.GetParts() {
		report.Parts[i] = PartReport{
			Kind: named(partKinds, part.GetKind(), PartKindUnknown), Name: part.GetName(), Source: sourceFromProto(part.GetSource()), Bytes: part.GetBytes(),
			Tokens: optional(part.Tokens), Fingerprint: part.GetFingerprint(), Stable: part.GetStable(),
		}
	}
	for i, variable := range m.GetVariables() {
		report.Variables[i] = VariableReport{Name: variable.GetName(), Source: sourceFromProto(variable.GetSource())}
	}
	for _, step := range m.GetSkipped() {
		report.Skipped = append(report.Skipped, skippedFromProto(step))
	}
	if order := m.GetToolOrder(); order != nil {
		report.ToolOrder = &ToolOrderReport{
			Kept: order.GetKept(), Position: order.GetPosition(), SortedTool: order.GetSortedTool(), KeptTool: order.GetKeptTool(),
		}
	}
	return report
}
