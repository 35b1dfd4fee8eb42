// Features tool-slots and part-slots: the stream's base, invocations and next() results
// resolved, replies named by slot, parts matched by value.

package dsp

import (
	"sync"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// A listener stream's parts by slot (docs/protocol.md, "Part slots" and "Tool
// slots"). The sidecar and this client both hold the stream's base, the parts of
// its previous invocation: an invocation names its unchanged parts by their place
// there, and a reply or next() result names its unchanged parts by their place in
// its invocation. Parts are matched by value, so whatever a listener leaves as it
// was does not cross the wire again; the listener only ever sees plain values.

// The listener features this client implements.
const (
	// featureToolSlots: this client decodes ListenerNextResult.tool_slots.
	featureToolSlots = "tool-slots"
	// featurePartSlots: this client keeps the stream's base and reads and sends PartSlots.
	featurePartSlots = "part-slots"
)

// slotting is what a listener stream's replies name by slot.
type slotting int

const (
	slotsNone  slotting = iota // neither feature in effect: every part in full
	slotsTools                 // "tool-slots" alone: the tools
	slotsParts                 // "part-slots": every kind of part
)

// slottingOf is what both sides of a listener stream support: what start offered
// and registered confirmed.
func slottingOf(start *pb.ListenStart, registered *pb.ListenerRegistered) slotting {
	both := func(feature string) bool {
		return contains(start.GetFeatures(), feature) && contains(registered.GetFeatures(), feature)
	}
	switch {
	case both(featurePartSlots):
		return slotsParts
	case both(featureToolSlots):
		return slotsTools
	}
	return slotsNone
}

// item is a variable as held: comparable, so that it is matched by value (a value
// absent and an empty one differ).
type item struct {
	name  string
	value string
	set   bool
}

func itemOf(v Variable) item {
	if v.Value == nil {
		return item{name: v.Name}
	}
	return item{name: v.Name, value: *v.Value, set: true}
}

func (i item) variable() Variable {
	if !i.set {
		return Variable{Name: i.name}
	}
	value := i.value // a pointer of its own: a listener writing through it changes nothing held
	return Variable{Name: i.name, Value: &value}
}

// kind is one kind of part of an assembly both sides hold, and each part's place in it.
type kind[T comparable] struct {
	parts  []T // never handed out: listeners get copies
	once   sync.Once
	places map[T]int32 // by value, built on first use
}

// place is the slot of a part equal to part, or -1.
func (k *kind[T]) place(part T) int32 {
	k.once.Do(func() {
		k.places = make(map[T]int32, len(k.parts))
		for i := len(k.parts) - 1; i >= 0; i-- {
			k.places[k.parts[i]] = int32(i) // equal parts twice: either slot names the same value
		}
	})
	if slot, found := k.places[part]; found {
		return slot
	}
	return -1
}

// slots are each part's slot in k, or -1 for one it does not hold; nil when it
// holds none of them (the parts then go in full, which means the same). At most
// len(k.parts) parts are named (the limit in docs/protocol.md, "Part slots": the
// sidecar refuses a longer list), so a part repeated past that goes in full.
func (k *kind[T]) slots(parts []T) []int32 {
	slots := make([]int32, len(parts))
	named := 0
	guess := 0
	for i, part := range parts {
		slot := int32(-1)
		switch {
		case named == len(k.parts):
			// the limit reached: the rest in full
		case guess < len(k.parts) && k.parts[guess] == part:
			slot = int32(guess) // a run of unchanged parts is matched without hashing them
		default:
			slot = k.place(part)
		}
		if slot >= 0 {
			guess, named = int(slot)+1, named+1
		}
		slots[i] = slot
	}
	if named == 0 {
		return nil
	}
	return slots
}

// sent are the parts that slots do not name.
func sent[T any](parts []T, slots []int32) []T {
	if slots == nil {
		return parts
	}
	fresh := make([]T, 0, len(parts))
	for i, part := range parts {
		if slots[i] < 0 {
			fresh = append(fresh, part)
		}
	}
	return fresh
}

// resolveSlots is one kind's parts of a message: each slot the part of held at that
// place, each -1 the next of fresh; no slots: fresh as it is. Slots that cannot
// be right (named in where) are a protocol error.
func resolveSlots[T comparable](slots []int32, fresh, held []T, noun, where string) ([]T, error) {
	if len(slots) == 0 {
		return fresh, nil
	}
	bound := len(held) + len(fresh) // as the sidecar bounds replies: no cost past what is named
	parts := make([]T, 0, fewer(len(slots), bound))
	next := 0
	for i, slot := range slots {
		switch {
		case slot < -1 || int(slot) >= len(held):
			return nil, protocolError("%s came with %s slot %d, but %d %ss were held", where, noun, slot, len(held), noun)
		case i == bound:
			return nil, protocolError("%s came with %d %s slots, more than the %d %ss held and %d sent",
				where, len(slots), noun, len(held), noun, len(fresh))
		case slot >= 0:
			parts = append(parts, held[slot])
		case next == len(fresh):
			return nil, protocolError("%s came with more -1 %s slots than new %ss", where, noun, noun)
		default:
			parts = append(parts, fresh[next])
			next++
		}
	}
	if next != len(fresh) {
		return nil, protocolError("%s came with more new %ss than -1 %s slots", where, noun, noun)
	}
	return parts, nil
}

func fewer(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// parts is an assembly as the sidecar holds it too: an invocation's, which is also
// the stream's base until the next invocation. Its lists never change.
type parts struct {
	sections, contexts kind[Part]
	tools              kind[ToolSchema]
	variables          kind[item]
}

func itemsFromProto(messages []*pb.Variable) []item {
	items := make([]item, len(messages))
	for i, m := range messages {
		items[i] = item{name: m.GetName(), value: m.GetValue(), set: m.Value != nil}
	}
	return items
}

// invocationParts are an invocation's parts: slots against base (the stream's; nil before
// the first invocation, and without part-slots), the rest from message.
func invocationParts(message *pb.PromptAssembly, slots *pb.PartSlots, base *parts) (*parts, error) {
	if base == nil {
		base = &parts{}
	}
	return base.resolve(message, slots, slots.GetTools(), "an invocation")
}

// resolve is the parts of message whose slots (toolSlots for the tools) name parts of p.
func (p *parts) resolve(message *pb.PromptAssembly, slots *pb.PartSlots, toolSlots []int32, where string) (*parts, error) {
	r := &parts{}
	var err error
	if r.sections.parts, err = resolveSlots(slots.GetSections(), partsFromProto(message.GetSections()), p.sections.parts, "section", where); err != nil {
		return nil, err
	}
	if r.contexts.parts, err = resolveSlots(slots.GetContexts(), partsFromProto(message.GetContexts()), p.contexts.parts, "context", where); err != nil {
		return nil, err
	}
	if r.tools.parts, err = resolveSlots(toolSlots, toolsFromProto(message.GetTools()), p.tools.parts, "tool", where); err != nil {
		return nil, err
	}
	if r.variables.parts, err = resolveSlots(slots.GetVariables(), itemsFromProto(message.GetVariables()), p.variables.parts, "variable", where); err != nil {
		return nil, err
	}
	return r, nil
}

// assembly is these parts for a listener: copies, so that nothing the listener
// does changes what is held.
func (p *parts) assembly() *Assembly {
	a := &Assembly{
		Sections:  append(make([]Part, 0, len(p.sections.parts)), p.sections.parts...),
		Contexts:  append(make([]Part, 0, len(p.contexts.parts)), p.contexts.parts...),
		Tools:     append(make([]ToolSchema, 0, len(p.tools.parts)), p.tools.parts...),
		Variables: make([]Variable, len(p.variables.parts)),
	}
	for i, held := range p.variables.parts {
		a.Variables[i] = held.variable()
	}
	return a
}

// decode is what next() returned: its slots read against this invocation whether
// the feature is in effect or not (a sidecar before feature negotiation always
// sent tool slots). Slots that cannot be right are a protocol error.
func (p *parts) decode(result *pb.ListenerNextResult) (*Assembly, error) {
	slots, toolSlots := result.GetSlots(), result.GetToolSlots()
	if len(slots.GetTools()) > 0 {
		if len(toolSlots) > 0 {
			return nil, protocolError("next() came back with both tool_slots and slots.tools")
		}
		toolSlots = slots.GetTools()
	}
	returned, err := p.resolve(result.GetAssembly(), slots, toolSlots, "next()")
	if err != nil {
		return nil, err
	}
	return returned.assembly(), nil
}

// reply is an assembly a listener hands on or returns, as a ListenerNext or
// ListenerResult carries it: the parts this invocation holds named by slot, as
// far as mode allows, and the others in full.
type reply struct {
	assembly  *pb.PromptAssembly
	slots     *pb.PartSlots // with part-slots; nil when it names nothing
	toolSlots []int32       // with tool-slots alone
}

// encode is a listener's assembly as a reply to this invocation.
func (p *parts) encode(a *Assembly, mode slotting) (reply, error) {
	if a == nil {
		return reply{}, invalid("a listener must return an assembly, not nil")
	}
	switch mode {
	case slotsNone:
		return reply{assembly: assemblyToProto(a)}, nil
	case slotsTools:
		toolSlots := p.tools.slots(a.Tools)
		fresh := *a
		fresh.Tools = sent(a.Tools, toolSlots)
		return reply{assembly: assemblyToProto(&fresh), toolSlots: toolSlots}, nil
	}
	items := make([]item, len(a.Variables))
	for i, v := range a.Variables {
		items[i] = itemOf(v)
	}
	slots := &pb.PartSlots{
		Sections:  p.sections.slots(a.Sections),
		Contexts:  p.contexts.slots(a.Contexts),
		Tools:     p.tools.slots(a.Tools),
		Variables: p.variables.slots(items),
	}
	fresh := &Assembly{
		Sections:  sent(a.Sections, slots.Sections),
		Contexts:  sent(a.Contexts, slots.Contexts),
		Tools:     sent(a.Tools, slots.Tools),
		Variables: sent(a.Variables, slots.Variables),
	}
	if slots.Sections == nil && slots.Contexts == nil && slots.Tools == nil && slots.Variables == nil {
		slots = nil // nothing held is named: every part in full
	}
	return reply{assembly: assemblyToProto(fresh), slots: slots}, nil
}
