// An Assemble reply decoded straight from its bytes into types.go's values.

package dsp

import (
	"fmt"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Assemble's answer is decoded straight into this package's types: an
// AssembleResponse is tens of kilobytes of strings, and decoding it into
// generated messages first (UTF-8 checks and one allocation per string), then
// converting, cost the Go client a third of an empty RPC's time (most of it
// the garbage collector's, after an allocation per string). Here the reply's
// bytes are copied once, into one string (gRPC may reuse its buffer), and every
// name, text and tool schema is a piece of it.

const assembleMethod = "/dsh.systemprompt.v1.SystemPromptService/Assemble"

// assembleReply is what an AssembleResponse carries that this package returns.
type assembleReply struct {
	assembly        *Assembly
	prompt          string
	contextSnapshot string
	skipped         []SkippedStep
	report          *AssemblyReport // when asked for
	scopeChain      []string        // the scope keys it read, nearest first
	replyScalars                    // revision, cacheable, cacheRevision, cacheableWithFields
}

// replyCodec marshals requests as protobuf and decodes an *assembleReply by hand.
type replyCodec struct{}

func (replyCodec) Name() string { return "proto" }

func (replyCodec) Marshal(v any) ([]byte, error) {
	message, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("dsp: cannot marshal %T", v)
	}
	return proto.Marshal(message)
}

func (replyCodec) Unmarshal(data []byte, v any) error {
	reply, ok := v.(*assembleReply)
	if !ok {
		return fmt.Errorf("dsp: cannot unmarshal into %T", v)
	}
	w := wire{data: data, text: string(data)}
	reply.assembly = emptyAssembly()
	reply.replyScalars = readScalars(data)
	return w.fields(0, len(data), func(f field) error {
		switch f.number {
		case 1: // AssembleResponse.assembly
			return w.assembly(f, reply.assembly)
		case 2: // AssembleResponse.rendered
			return w.fields(f.from, f.to, func(r field) error {
				switch r.number {
				case 1:
					reply.prompt = w.string(r)
				case 2:
					reply.contextSnapshot = w.string(r)
				}
				return nil
			})
		case 4: // AssembleResponse.report: asked for, and costly on the sidecar anyway
			var report pb.AssemblyReport
			if err := proto.Unmarshal(w.data[f.from:f.to], &report); err != nil {
				return err
			}
			reply.report = reportFromProto(&report)
		case 6: // AssembleResponse.skipped: rare, decoded the plain way
			var step pb.SkippedStep
			if err := proto.Unmarshal(w.data[f.from:f.to], &step); err != nil {
				return err
			}
			reply.skipped = append(reply.skipped, skippedFromProto(&step))
		case 8: // AssembleResponse.scope_chain
			reply.scopeChain = append(reply.scopeChain, w.string(f))
		}
		return nil // revision, cacheable, cache_revision and cacheable_with_fields: readScalars
	})
}

func skippedFromProto(step *pb.SkippedStep) SkippedStep {
	return SkippedStep{
		Kind: kindFromProto(step.GetKind()), Name: step.GetName(), Scope: step.GetScope(),
		Ref: step.GetRef(), Reason: Reason(step.GetReason()), Message: step.GetMessage(),
	}
}

func emptyAssembly() *Assembly {
	return &Assembly{Sections: []Part{}, Contexts: []Part{}, Tools: []ToolSchema{}, Variables: []Variable{}}
}

// wire is one reply's bytes to parse, and their copy to take pieces of.
type wire struct {
	data []byte
	text string
}

// field is one length-delimited field: its number and the span of its bytes.
type field struct {
	number   protowire.Number
	from, to int
}

func (w *wire) string(f field) string { return w.text[f.from:f.to] }

// fields visits the length-delimited fields of data[from:to]; fields of other
// wire types are skipped, as a field of the wrong type is unknown to protobuf.
func (w *wire) fields(from, to int, visit func(field) error) error {
	for at := from; at < to; {
		number, kind, n := protowire.ConsumeTag(w.data[at:to])
		if n < 0 {
			return protowire.ParseError(n)
		}
		at += n
		if kind != protowire.BytesType {
			m := protowire.ConsumeFieldValue(number, kind, w.data[at:to])
			if m < 0 {
				return protowire.ParseError(m)
			}
			at += m
			continue
		}
		value, m := protowire.ConsumeBytes(w.data[at:to])
		if m < 0 {
			return protowire.ParseError(m)
		}
		end := at + m
		if err := visit(field{number: number, from: end - len(value), to: end}); err != nil {
			return err
		}
		at = end
	}
	return nil
}

// assembly decodes a PromptAssembly{1: sections, 2: contexts, 3: tools, 4: variables}.
func (w *wire) assembly(f field, a *Assembly) error {
	return w.fields(f.from, f.to, func(item field) error {
		switch item.number {
		case 1, 2:
			part, err := w.part(item)
			if item.number == 1 {
				a.Sections = append(a.Sections, part)
			} else {
				a.Contexts = append(a.Contexts, part)
			}
			return err
		case 3:
			tool, err := w.tool(item)
			a.Tools = append(a.Tools, tool)
			return err
		case 4:
			variable, err := w.variable(item)
			a.Variables = append(a.Variables, variable)
			return err
		}
		return nil
	})
}

// part decodes an AssembledSection or AssembledContext{1: name, 2: text}.
func (w *wire) part(f field) (Part, error) {
	var p Part
	err := w.fields(f.from, f.to, func(item field) error {
		switch item.number {
		case 1:
			p.Name = w.string(item)
		case 2:
			p.Text = w.string(item)
		}
		return nil
	})
	return p, err
}

// tool decodes a ToolSchema{1: name, 2: description, 3: parameters_json}.
func (w *wire) tool(f field) (ToolSchema, error) {
	var t ToolSchema
	err := w.fields(f.from, f.to, func(item field) error {
		switch item.number {
		case 1:
			t.Name = w.string(item)
		case 2:
			t.Description = w.string(item)
		case 3:
			t.ParametersJSON = w.string(item)
		}
		return nil
	})
	return t, err
}

// variable decodes a Variable{1: name, 2: optional value}.
func (w *wire) variable(f field) (Variable, error) {
	var v Variable
	err := w.fields(f.from, f.to, func(item field) error {
		switch item.number {
		case 1:
			v.Name = w.string(item)
		case 2:
			value := w.string(item)
			v.Value = &value
		}
		return nil
	})
	return v, err
}
