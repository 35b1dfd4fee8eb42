package dsp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Part slots (docs/protocol.md, "Part slots") on a real sidecar: whatever a
// listener does to its assembly, before or after next(), comes out as if every
// part were sent in full, on a stream's first invocation and on the ones named
// against its base; and what the listener leaves as it was crosses as a slot.

// listenWire records every message of the Listen streams of one client.
type listenWire struct {
	mu        sync.Mutex
	sent      []*pb.ListenRequest
	received  []*pb.ListenResponse
	confirmed [][]string // each stream's ListenerRegistered.features
}

// option is the dial option that records the client's Listen streams on w.
func (w *listenWire) option() dsp.Option {
	return dsp.WithDialOptions(grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
		method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		stream, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || !strings.HasSuffix(method, "/Listen") {
			return stream, err
		}
		return &recordedStream{ClientStream: stream, wire: w}, nil
	}))
}

// take returns what was recorded since the last take, and forgets it.
func (w *listenWire) take() ([]*pb.ListenRequest, []*pb.ListenResponse) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sent, received := w.sent, w.received
	w.sent, w.received = nil, nil
	return sent, received
}

type recordedStream struct {
	grpc.ClientStream
	wire *listenWire
}

func (s *recordedStream) SendMsg(m any) error {
	s.wire.mu.Lock()
	s.wire.sent = append(s.wire.sent, proto.Clone(m.(proto.Message)).(*pb.ListenRequest))
	s.wire.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (s *recordedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		response := proto.Clone(m.(proto.Message)).(*pb.ListenResponse)
		s.wire.mu.Lock()
		if registered := response.GetRegistered(); registered != nil {
			s.wire.confirmed = append(s.wire.confirmed, registered.GetFeatures())
		} else {
			s.wire.received = append(s.wire.received, response)
		}
		s.wire.mu.Unlock()
	}
	return err
}

// slotted connects a client whose Listen streams w records, and a scope named for the test.
func slotted(t *testing.T, w *listenWire) (*dsp.Client, *dsp.Scope) {
	t.Helper()
	client := connect(t, shared(t), w.option())
	key := "go-slots-" + strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return client, must[*dsp.Scope](t)(client.Scope(bg, strings.ToLower(key)))
}

// loadParts registers three parts of each kind (two contexts) in scope.
func loadParts(t *testing.T, scope *dsp.Scope) {
	t.Helper()
	for i, name := range []string{"rules", "style", "notes"} {
		must[*dsp.Handle[string]](t)(scope.Section(bg, name, float64(10+i), "the "+name+" section"))
	}
	must[*dsp.Handle[string]](t)(scope.Context(bg, "cwd", 1, "/work"))
	must[*dsp.Handle[string]](t)(scope.Context(bg, "branch", 2, "main"))
	tools := []dsp.ToolSchema{}
	for _, name := range []string{"bash", "read", "grep"} {
		tools = append(tools, dsp.ToolSchema{Name: name, Description: "the " + name + " tool", ParametersJSON: `{"type": "object"}`})
	}
	must[*dsp.Handle[dsp.ToolProviderResult]](t)(scope.Tools(bg, dsp.ToolProviderResult{Schemas: tools}))
	for _, v := range [][2]string{{"mode", "fast"}, {"user", "ann"}, {"host", "box"}} {
		must[*dsp.VariableHandle](t)(scope.Variable(bg, v[0], v[1]))
	}
}

type change func(a *dsp.Assembly)

func reversed[T any](list []T) {
	for i, j := 0, len(list)-1; i < j; i, j = i+1, j-1 {
		list[i], list[j] = list[j], list[i]
	}
}

func without[T any](list []T, name func(T) string, gone string) []T {
	kept := []T{}
	for _, part := range list {
		if name(part) != gone {
			kept = append(kept, part)
		}
	}
	return kept
}

func partName(p dsp.Part) string             { return p.Name }
func variableName(v dsp.Variable) string     { return v.Name }
func toolSchemaName(s dsp.ToolSchema) string { return s.Name }

var changes = []struct {
	name   string
	change change
}{
	{"reorders", func(a *dsp.Assembly) {
		reversed(a.Sections)
		reversed(a.Contexts)
		reversed(a.Tools)
		reversed(a.Variables)
	}},
	{"removes", func(a *dsp.Assembly) {
		a.Sections = without(a.Sections, partName, "style")
		a.Contexts = without(a.Contexts, partName, "cwd")
		a.Tools = without(a.Tools, toolSchemaName, "grep")
		a.Variables = without(a.Variables, variableName, "mode")
	}},
	{"replaces", func(a *dsp.Assembly) {
		a.Sections[len(a.Sections)-1].Text = "changed in place"
		a.Contexts[len(a.Contexts)-1] = dsp.Part{Name: a.Contexts[len(a.Contexts)-1].Name, Text: "a new text"}
		a.Tools[0].Description = "a new description"
		a.Tools[1].ParametersJSON = `{"type": "object", "title": "changed in place"}`
		for i := range a.Variables {
			switch a.Variables[i].Name {
			case "mode":
				replaced := "replaced"
				a.Variables[i].Value = &replaced
			case "user":
				a.Variables[i].Value = nil
			}
		}
	}},
	{"adds", func(a *dsp.Assembly) {
		a.Sections = append([]dsp.Part{{Name: "added", Text: "a new section"}}, a.Sections...)
		a.Contexts = append(a.Contexts, dsp.Part{Name: "added", Text: "a new context"})
		a.Tools = append(a.Tools, dsp.ToolSchema{Name: "added", Description: "a new tool", ParametersJSON: "{}"})
		added := "a new variable"
		a.Variables = append(a.Variables, dsp.Variable{Name: "added", Value: &added})
	}},
}

// plain is an assembly as text, every part and variable value spelled out.
func plain(a *dsp.Assembly) string {
	var b strings.Builder
	for _, s := range a.Sections {
		fmt.Fprintf(&b, "section %q %q\n", s.Name, s.Text)
	}
	for _, c := range a.Contexts {
		fmt.Fprintf(&b, "context %q %q\n", c.Name, c.Text)
	}
	for _, tool := range a.Tools {
		fmt.Fprintf(&b, "tool %q %q %s\n", tool.Name, tool.Description, tool.ParametersJSON)
	}
	for _, v := range a.Variables {
		if v.Value == nil {
			fmt.Fprintf(&b, "variable %q unset\n", v.Name)
		} else {
			fmt.Fprintf(&b, "variable %q %q\n", v.Name, *v.Value)
		}
	}
	return b.String()
}

// changed is plain(a) after every change, a left as it is.
func changed(a *dsp.Assembly, all ...change) string {
	c := a.Clone()
	for _, change := range all {
		change(c)
	}
	return plain(c)
}

// changing is the field that makes before's and after's listeners change their
// assembly; without it they hand it on as it came, so that the same listeners
// give the registry's own assembly to compare with.
var changing = dsp.WithFields(map[string]any{"change": true})

func before(c change) dsp.Listener {
	return func(_ context.Context, a *dsp.Assembly, info dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		if info.Get("change") == true {
			c(a)
		}
		return next.Tail(a)
	}
}

func after(c change) dsp.Listener {
	return func(_ context.Context, a *dsp.Assembly, info dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		result, err := next.Call(a)
		if err != nil {
			return nil, err
		}
		if info.Get("change") == true {
			c(result)
		}
		return result, nil
	}
}

func same(t *testing.T, what, got, want string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s:\n%s\nwant:\n%s", what, got, want)
	}
}

// namedAgainstTheBase fails unless every stream confirmed part-slots and the
// invocations after each stream's first named parts by slot.
func namedAgainstTheBase(t *testing.T, w *listenWire, received []*pb.ListenResponse, streams int) {
	t.Helper()
	if len(w.confirmed) != streams {
		t.Fatalf("%d listener streams, want %d", len(w.confirmed), streams)
	}
	for _, features := range w.confirmed {
		equal(t, features, []string{"tool-slots", "part-slots", "callback-cache"})
	}
	for _, response := range received {
		if invocation := response.GetInvocation(); invocation != nil && invocation.GetSlots() == nil {
			t.Fatalf("an invocation after the stream's first came in full: %v", invocation)
		}
	}
}

func TestAListenersChangesComeOutAsIfEveryPartWereSent(t *testing.T) {
	for _, c := range changes {
		for _, around := range []struct {
			name     string
			listener func(change) dsp.Listener
		}{{"before next", before}, {"after next", after}} {
			c, around := c, around
			t.Run(c.name+" "+around.name, func(t *testing.T) {
				w := &listenWire{}
				client, scope := slotted(t, w)
				loadParts(t, scope)
				in := dsp.ForScope(scope.Key)
				must[*dsp.Registration](t)(scope.OnAssemble(bg, around.listener(c.change)))
				first := must[*dsp.Assembly](t)(client.Assemble(bg, in, changing))
				plainly := must[*dsp.Assembly](t)(client.Assemble(bg, in))
				same(t, "the first assembly", plain(first), changed(plainly, c.change))
				// A change to the registry: the next invocation differs from the stream's base.
				must[*dsp.Handle[string]](t)(scope.Section(bg, "late", 11.5, "registered between two assemblies"))
				must[*dsp.VariableHandle](t)(scope.Variable(bg, "extra", "x"))
				w.take()
				grown := must[*dsp.Assembly](t)(client.Assemble(bg, in, changing))
				again := must[*dsp.Assembly](t)(client.Assemble(bg, in, changing)) // named against the one before
				plainly = must[*dsp.Assembly](t)(client.Assemble(bg, in))
				if text(plainly, "late") == "<absent>" {
					t.Fatalf("the registry's change is not in the assembly: %s", plain(plainly))
				}
				same(t, "an assembly after a change", plain(grown), changed(plainly, c.change))
				same(t, "the same assembly again", plain(again), changed(plainly, c.change))
				_, received := w.take()
				namedAgainstTheBase(t, w, received, 1)
			})
		}
	}
}

func TestChainedListenersEachChangeWhatTheOneBeforeHandedOn(t *testing.T) {
	w := &listenWire{}
	client, scope := slotted(t, w)
	loadParts(t, scope)
	in := dsp.ForScope(scope.Key)
	adds, replaces, removes, reorders := changes[3].change, changes[2].change, changes[1].change, changes[0].change
	for _, listener := range []dsp.Listener{before(adds), before(replaces), after(reorders), before(removes)} {
		must[*dsp.Registration](t)(scope.OnAssemble(bg, listener))
	}
	plainly := must[*dsp.Assembly](t)(client.Assemble(bg, in)) // each stream's first invocation
	want := changed(plainly, adds, replaces, removes, reorders)
	w.take()
	for i := 0; i < 2; i++ {
		same(t, fmt.Sprintf("assembly %d", i), plain(must[*dsp.Assembly](t)(client.Assemble(bg, in, changing))), want)
	}
	_, received := w.take()
	namedAgainstTheBase(t, w, received, 4)
}

// fullParts is how many parts an assembly on the wire carries in full.
func fullParts(a *pb.PromptAssembly) int {
	return len(a.GetSections()) + len(a.GetContexts()) + len(a.GetTools()) + len(a.GetVariables())
}

func TestWhatAListenerLeavesAsItWasCrossesTheWireAsASlot(t *testing.T) {
	w := &listenWire{}
	client, scope := slotted(t, w)
	loadParts(t, scope)
	in := dsp.ForScope(scope.Key)
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		for i := range a.Sections {
			if a.Sections[i].Name == "style" {
				a.Sections[i].Text = "the listener's style"
			}
		}
		return next.Call(a) // returned as next() gave it
	}))
	for round := 0; round < 2; round++ {
		assembly := must[*dsp.Assembly](t)(client.Assemble(bg, in))
		if text(assembly, "style") != "the listener's style" || text(assembly, "rules") != "the rules section" {
			t.Fatalf("round %d: %s", round, plain(assembly))
		}
		sent, received := w.take()
		var invocation *pb.ListenerInvocation
		var next *pb.ListenerNext
		var nextResult *pb.ListenerNextResult
		var result *pb.ListenerResult
		for _, m := range received {
			invocation, nextResult = firstOf(invocation, m.GetInvocation()), firstOf(nextResult, m.GetNextResult())
		}
		for _, m := range sent {
			next, result = firstOf(next, m.GetNext()), firstOf(result, m.GetResult())
		}
		if invocation == nil || next == nil || nextResult == nil || result == nil {
			t.Fatalf("round %d: a message is missing: %v %v", round, sent, received)
		}
		// The first invocation has no base to name parts against; the second names every part.
		if full := fullParts(invocation.GetAssembly()); (round == 0) != (full > 0) || (round == 1) != (invocation.GetSlots() != nil) {
			t.Fatalf("round %d: the invocation carried %d parts in full: %v", round, full, invocation)
		}
		// Both ways, every reply carries the changed section alone, the rest by slot.
		for _, m := range []interface {
			GetAssembly() *pb.PromptAssembly
			GetSlots() *pb.PartSlots
			GetToolSlots() []int32
		}{next, nextResult, result} {
			a, slots := m.GetAssembly(), m.GetSlots()
			if fullParts(a) != 1 || a.GetSections()[0].GetText() != "the listener's style" || len(m.GetToolSlots()) != 0 {
				t.Fatalf("round %d: a reply carried more than the changed section in full: %v", round, m)
			}
			if len(slots.GetSections()) != len(invocation.GetAssembly().GetSections())+len(invocation.GetSlots().GetSections()) ||
				fmt.Sprint(slots.GetTools(), slots.GetContexts(), slots.GetVariables()) != "[0 1 2] [0 1] [0 1 2]" {
				t.Fatalf("round %d: the reply's slots: %v", round, slots)
			}
		}
	}
}

// firstOf is the first non-nil of found and m.
func firstOf[M any](found, m *M) *M {
	if found != nil {
		return found
	}
	return m
}

func TestAListenerMayRepeatAPartMoreOftenThanPartsAreHeld(t *testing.T) {
	w := &listenWire{}
	client, scope := slotted(t, w)
	loadParts(t, scope)
	in := dsp.ForScope(scope.Key)
	plainly := must[*dsp.Assembly](t)(client.Assemble(bg, in))
	repeatTools := func(a *dsp.Assembly) { // five copies of one of the three tools held
		a.Tools = []dsp.ToolSchema{a.Tools[0], a.Tools[0], a.Tools[0], a.Tools[0], a.Tools[0]}
	}
	must[*dsp.Registration](t)(scope.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		unique := a.Sections
		a.Sections = append([]dsp.Part{unique[0], unique[0], unique[0], unique[0]}, unique...) // handed on with names repeated
		result, err := next.Call(a)
		if err != nil {
			return nil, err
		}
		result.Sections = unique
		return result, nil
	}))
	must[*dsp.Registration](t)(scope.OnAssemble(bg, after(repeatTools)))
	w.take()
	for i := 0; i < 2; i++ { // the second invocation of each stream against its base
		same(t, fmt.Sprintf("assembly %d", i), plain(must[*dsp.Assembly](t)(client.Assemble(bg, in, changing))), changed(plainly, repeatTools))
	}
	sent, _ := w.take()
	repeated := 0
	for _, m := range sent {
		if result := m.GetResult(); result != nil && len(result.GetSlots().GetTools()) == 5 {
			equal(t, result.GetSlots().GetTools(), []int32{0, 0, 0, -1, -1}) // three held: two in full
			if len(result.GetAssembly().GetTools()) != 2 {
				t.Fatalf("a result's tools in full: %v, want the two past the limit", result.GetAssembly().GetTools())
			}
			repeated++
		}
	}
	if repeated != 4 { // both listeners return the five tools, in both assemblies
		t.Fatalf("%d results repeated the tools by slot, want 4", repeated)
	}
}
