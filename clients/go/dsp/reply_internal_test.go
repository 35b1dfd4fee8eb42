package dsp

import (
	"reflect"
	"testing"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func value(text string) *string { return &text }

// The hand decoder of Assemble's reply gives what the generated code and
// a listener's decoding give, for every field it reads.
func TestTheReplyDecoderAgreesWithTheGeneratedCode(t *testing.T) {
	replies := []*pb.AssembleResponse{
		{},
		{Assembly: &pb.PromptAssembly{}},
		{
			Assembly: &pb.PromptAssembly{
				Sections: []*pb.AssembledSection{{Name: "a", Text: "Ä {{x}}"}, {Name: "", Text: ""}, {Name: "b"}},
				Contexts: []*pb.AssembledContext{{Name: "c", Text: "Now."}},
				Tools: []*pb.ToolSchema{
					{Name: "t", Description: "d", ParametersJson: `{"type": "object"}`},
					{Name: "bare"},
				},
				Variables: []*pb.Variable{{Name: "x", Value: value("1")}, {Name: "none"}, {Name: "empty", Value: value("")}},
			},
			Rendered:  &pb.RenderedPrompt{Prompt: "P", ContextSnapshot: "S"},
			Revision:  7,
			Cacheable: true,
			Report:    &pb.AssemblyReport{Tokenizer: "t", Prompt: &pb.Size{Bytes: 3}},
		},
		{Revision: 9, CacheRevision: 8, CacheableWithFields: true, ScopeChain: []string{"team"}},
	}
	for _, reply := range replies {
		data, err := proto.Marshal(reply)
		if err != nil {
			t.Fatal(err)
		}
		// A field this client does not know (a newer sidecar's), of each wire type, is skipped.
		data = protowire.AppendTag(data, 99, protowire.VarintType)
		data = protowire.AppendVarint(data, 5)
		data = protowire.AppendTag(data, 98, protowire.BytesType)
		data = protowire.AppendString(data, "later")
		var decoded assembleReply
		if err := (replyCodec{}).Unmarshal(data, &decoded); err != nil {
			t.Fatal(err)
		}
		held, err := invocationParts(reply.GetAssembly(), nil, nil) // as a listener is handed it
		if err != nil {
			t.Fatal(err)
		}
		want := held.assembly()
		if !reflect.DeepEqual(decoded.assembly, want) {
			t.Fatalf("decoded %#v\nwant %#v", decoded.assembly, want)
		}
		if decoded.prompt != reply.GetRendered().GetPrompt() || decoded.contextSnapshot != reply.GetRendered().GetContextSnapshot() {
			t.Fatalf("rendered: %q %q", decoded.prompt, decoded.contextSnapshot)
		}
		scalars := replyScalars{reply.GetRevision(), reply.GetCacheable(), reply.GetCacheRevision(), reply.GetCacheableWithFields()}
		if decoded.replyScalars != scalars || !reflect.DeepEqual(decoded.scopeChain, reply.GetScopeChain()) {
			t.Fatalf("the scalars %+v and scope chain %q, want %+v and %q", decoded.replyScalars, decoded.scopeChain, scalars, reply.GetScopeChain())
		}
		if (decoded.report == nil) != (reply.Report == nil) ||
			(decoded.report != nil && (decoded.report.Tokenizer != "t" || decoded.report.Prompt.Bytes != 3 || decoded.report.Tools.Tokens != nil)) {
			t.Fatalf("the report: %+v", decoded.report)
		}
	}
}

func TestTheReplyDecoderRefusesTruncatedBytesAndSharesNoMemoryWithTheBuffer(t *testing.T) {
	data, _ := proto.Marshal(&pb.AssembleResponse{Assembly: &pb.PromptAssembly{
		Tools: []*pb.ToolSchema{{Name: "a", ParametersJson: "{}"}, {Name: "b", ParametersJson: "[]"}},
	}})
	if err := (replyCodec{}).Unmarshal(data[:len(data)-1], &assembleReply{}); err == nil {
		t.Fatal("a truncated reply decodes")
	}
	var decoded assembleReply
	if err := (replyCodec{}).Unmarshal(data, &decoded); err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = 0 // gRPC may reuse its buffer
	}
	if decoded.assembly.Tools[1].ParametersJSON != "[]" || decoded.assembly.Tools[0].ParametersJSON != "{}" || decoded.assembly.Tools[0].Name != "a" {
		t.Fatalf("the decoded reply shares memory it should not: %+v", decoded.assembly.Tools)
	}
}
