package dsp_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"dsh.dev/dsh-system-prompt/clients/go/dsp"
	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/protobuf/proto"
)

// Part slots against a scripted sidecar that confirms part-slots: the client reads
// invocations against the stream's base and next() results against their
// invocation, replies by slot, fails a next() or an invocation it cannot read.

// invocationWith is an invocation of tools, its slots named against the stream's base.
func invocationWith(id uint64, slots *pb.PartSlots, tools ...string) *pb.ListenResponse {
	return &pb.ListenResponse{Kind: &pb.ListenResponse_Invocation{Invocation: &pb.ListenerInvocation{
		InvocationId: id, Assembly: wireAssembly(nil, tools...), Context: &pb.AssembleContext{}, Slots: slots,
	}}}
}

// wireAssembly is an assembly on the wire with sections and tools of those names.
func wireAssembly(sections []string, tools ...string) *pb.PromptAssembly {
	assembly := &pb.PromptAssembly{}
	for _, name := range sections {
		assembly.Sections = append(assembly.Sections, &pb.AssembledSection{Name: name, Text: "the " + name + " section"})
	}
	for _, name := range tools {
		assembly.Tools = append(assembly.Tools, &pb.ToolSchema{Name: name, ParametersJson: "{}"})
	}
	return assembly
}

// reply is the client's next message on a scripted listener stream.
func reply(t *testing.T, stream pb.SystemPromptService_ListenServer) *pb.ListenRequest {
	t.Helper()
	message, err := stream.Recv()
	check(t, err)
	return message
}

func TestTheClientReadsInvocationsAgainstItsBaseAndRepliesBySlot(t *testing.T) {
	replies := make(chan *pb.ListenRequest, 4)
	running, release := make(chan struct{}), make(chan struct{})
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		check(t, stream.Send(invocationWith(1, nil, "a", "b")))
		replies <- reply(t, stream)
		check(t, stream.Send(invocationWith(2, &pb.PartSlots{Tools: []int32{1, -1, 0}}, "c")))
		<-running
		// A repeat of a running invocation is not run again, but it is the base all the same.
		check(t, stream.Send(invocationWith(2, &pb.PartSlots{Tools: []int32{2}})))
		check(t, stream.Send(invocationWith(3, &pb.PartSlots{Tools: []int32{0, -1}}, "d")))
		replies <- reply(t, stream)
		close(release)
		replies <- reply(t, stream)
		return drain(stream)
	}}
	client := connectScripted(t, serveScript(t, s))
	seen := make(chan []string, 4)
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		seen <- toolNames(a)
		if len(a.Tools) == 3 {
			close(running)
			<-release // invocation 2 runs while its repeat and invocation 3 come
		}
		a.Tools = a.Tools[1:]
		return next.Tail(a)
	}))
	first := (<-replies).GetNext()
	third, second := (<-replies).GetNext(), (<-replies).GetNext()
	equal(t, <-seen, []string{"a", "b"})
	equal(t, <-seen, []string{"b", "c", "a"})
	equal(t, <-seen, []string{"a", "d"}) // against invocation 2's repeat: [a]
	if fmt.Sprint(first.GetSlots().GetTools()) != "[1]" || len(first.GetAssembly().GetTools()) != 0 || len(first.GetToolSlots()) != 0 {
		t.Fatalf("the first invocation's remaining tool goes back as a slot: %v", first)
	}
	if second.GetInvocationId() != 2 || fmt.Sprint(second.GetSlots().GetTools()) != "[1 2]" || len(second.GetToolSlots()) != 0 {
		t.Fatalf("the second names its tools against its own invocation: %v", second)
	}
	if third.GetInvocationId() != 3 || fmt.Sprint(second.GetSlots().GetSections(), third.GetSlots().GetTools()) != "[] [1]" {
		t.Fatalf("the third: %v", third)
	}
}

func TestNextResultsAreReadAgainstTheirInvocationAndTheResultNamesItsParts(t *testing.T) {
	replies := make(chan *pb.ListenRequest, 4)
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		invocation := wireAssembly([]string{"s0", "s1"}, "t0", "t1")
		invocation.Contexts = []*pb.AssembledContext{{Name: "c0", Text: "now"}}
		invocation.Variables = []*pb.Variable{{Name: "v0", Value: proto.String("1")}, {Name: "v1"}}
		check(t, stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_Invocation{Invocation: &pb.ListenerInvocation{
			InvocationId: 1, Assembly: invocation, Context: &pb.AssembleContext{},
		}}}))
		replies <- reply(t, stream)
		check(t, stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_NextResult{NextResult: &pb.ListenerNextResult{
			InvocationId: 1, Assembly: wireAssembly([]string{"new"}),
			Slots: &pb.PartSlots{Sections: []int32{-1, 1, 0}, Contexts: []int32{0}, Tools: []int32{1}, Variables: []int32{1, 0}},
		}}}))
		replies <- reply(t, stream)
		return drain(stream)
	}}
	client := connectScripted(t, serveScript(t, s))
	returned := make(chan *dsp.Assembly, 1)
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(_ context.Context, a *dsp.Assembly, _ dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		result, err := next.Call(a)
		if err != nil {
			return nil, err
		}
		returned <- result.Clone()
		result.Sections = append(result.Sections, dsp.Part{Name: "post", Text: "after the rest"})
		return result, nil
	}))
	next, result := (<-replies).GetNext(), (<-replies).GetResult()
	if fullParts(next.GetAssembly()) != 0 || fmt.Sprint(next.GetSlots()) != fmt.Sprint(&pb.PartSlots{
		Sections: []int32{0, 1}, Contexts: []int32{0}, Tools: []int32{0, 1}, Variables: []int32{0, 1},
	}) {
		t.Fatalf("an unchanged assembly goes to next() as slots alone: %v", next)
	}
	same(t, "what next() returned", plain(<-returned), plain(&dsp.Assembly{
		Sections:  []dsp.Part{{Name: "new", Text: "the new section"}, {Name: "s1", Text: "the s1 section"}, {Name: "s0", Text: "the s0 section"}},
		Contexts:  []dsp.Part{{Name: "c0", Text: "now"}},
		Tools:     []dsp.ToolSchema{{Name: "t1", ParametersJSON: "{}"}},
		Variables: []dsp.Variable{{Name: "v1"}, {Name: "v0", Value: proto.String("1")}},
	}))
	sections := result.GetAssembly().GetSections()
	if len(sections) != 2 || sections[0].GetName() != "new" || sections[1].GetName() != "post" || fullParts(result.GetAssembly()) != 2 ||
		fmt.Sprint(result.GetSlots()) != fmt.Sprint(&pb.PartSlots{
			Sections: []int32{-1, 1, 0, -1}, Contexts: []int32{0}, Tools: []int32{1}, Variables: []int32{1, 0},
		}) {
		t.Fatalf("the result names the invocation's parts by slot, the others in full: %v", result)
	}
}

func TestNextResultsWhosePartSlotsCannotBeRightFailNext(t *testing.T) {
	bad := []struct {
		result *pb.ListenerNextResult
		words  string
	}{
		{&pb.ListenerNextResult{Slots: &pb.PartSlots{Sections: []int32{9}}}, "section slot 9, but 1 sections were held"},
		{&pb.ListenerNextResult{Slots: &pb.PartSlots{Variables: []int32{-2}}}, "variable slot -2"},
		{&pb.ListenerNextResult{Slots: &pb.PartSlots{Sections: []int32{-1}}}, "more -1 section slots than new sections"},
		{&pb.ListenerNextResult{Assembly: wireAssembly([]string{"x", "y"}), Slots: &pb.PartSlots{Sections: []int32{-1, 0}}},
			"more new sections than -1 section slots"},
		{&pb.ListenerNextResult{Slots: &pb.PartSlots{Tools: []int32{0}}, ToolSlots: []int32{0}}, "both tool_slots and slots.tools"},
		{&pb.ListenerNextResult{Slots: &pb.PartSlots{Sections: make([]int32, 3)}}, "3 section slots, more than the 1 sections held and 0 sent"},
	}
	replies := make(chan *pb.ListenRequest, len(bad))
	s := &script{listen: func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		for i, c := range bad {
			id := uint64(i + 1)
			check(t, stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_Invocation{Invocation: &pb.ListenerInvocation{
				InvocationId: id, Assembly: wireAssembly([]string{"s"}, "t"), Context: &pb.AssembleContext{},
			}}}))
			reply(t, stream) // the next()
			c.result.InvocationId = id
			check(t, stream.Send(&pb.ListenResponse{Kind: &pb.ListenResponse_NextResult{NextResult: c.result}}))
			replies <- reply(t, stream)
		}
		return drain(stream)
	}}
	client := connectScripted(t, serveScript(t, s))
	must[*dsp.Registration](t)(client.OnAssemble(bg, passThrough))
	for _, c := range bad {
		failure := (<-replies).GetFailure()
		if failure == nil || !contains(failure.GetMessage(), "protocol error: next() came") || !contains(failure.GetMessage(), c.words) {
			t.Fatalf("want a failure saying %q, got %v", c.words, failure)
		}
	}
}

func TestTheClientThatCannotReadAnInvocationFailsItAndListensAnew(t *testing.T) {
	replies := make(chan *pb.ListenRequest, 2)
	s := &script{}
	s.listen = func(start *pb.ListenStart, stream pb.SystemPromptService_ListenServer) error {
		check(t, stream.Send(registered(start)))
		if s.listens.Load() == 1 {
			check(t, stream.Send(invocationWith(1, &pb.PartSlots{Tools: []int32{3}})))
			replies <- reply(t, stream)
			// The stream's base is lost: the client half-closes, and runs nothing more on it.
			check(t, stream.Send(invocationWith(2, nil, "a")))
		}
		return drain(stream)
	}
	client := connectScripted(t, serveScript(t, s))
	var runs atomic.Int32
	must[*dsp.Registration](t)(client.OnAssemble(bg, func(ctx context.Context, a *dsp.Assembly, c dsp.AssembleContext, next *dsp.Next) (*dsp.Assembly, error) {
		runs.Add(1)
		return passThrough(ctx, a, c, next)
	}))
	failure := (<-replies).GetFailure()
	if failure.GetInvocationId() != 1 || !contains(failure.GetMessage(), "an invocation came with tool slot 3, but 0 tools were held") {
		t.Fatalf("the invocation fails with a protocol error: %v", failure)
	}
	waitFor(t, "the listener installed again", func() bool { return s.listens.Load() == 2 })
	if runs.Load() != 0 {
		t.Fatalf("the listener ran %d times on a stream whose base was lost", runs.Load())
	}
}
