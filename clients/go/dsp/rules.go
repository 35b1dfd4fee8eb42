// Rules: waterfall steps the sidecar runs itself, in CEL, with no hop.

package dsp

import (
	"context"
	"math"

	pb "dsh.dev/dsh-system-prompt/clients/go/gen/dsh/systemprompt/v1"
)

// A rule (docs/protocol.md, "Rules") is a few CEL expressions over the assembly,
// its fields and its scope, with explicit operations on the assembly: Rule is what
// it does, the Mutation constructors (DropTools, KeepTools, OrderTools,
// UpsertSections, DropSections, UpsertContexts, DropContexts, SetVariables) its
// operations, RulePart a part an upsert adds or replaces. The expressions are CEL
// source text, compiled and checked by the sidecar when the rule is registered or
// updated (RULE_INVALID, naming the rule and the expression); what is malformed
// here is refused before anything is sent (INVALID_VALUE), as in the other clients.

// Rule is what a rule does: when every Match expression is true, its Mutations in
// order, each on what the one before it left.
type Rule struct {
	// Mutations are made by the Mutation constructors.
	Mutations []Mutation
	// Match holds CEL booleans: when any is false the rule leaves the assembly as it is.
	Match []string
	// Variables are named CEL sub-expressions, read as variables.NAME by the rule's
	// expressions (each by those before it).
	Variables []RuleVariable
	// FailurePolicy: FailurePolicyIgnore passes the rule over when an expression
	// fails at run time; FailurePolicyFail (or "", the default) fails the assembly
	// with RULE_FAILED.
	FailurePolicy FailurePolicy
}

// RuleVariable is a rule's named sub-expression.
type RuleVariable struct {
	Name       string
	Expression string
}

// RulePart is a section or context an upsert adds or replaces: Text is a CEL string
// expression ("'Be brief.'", "'Agent ' + fields.agent"). A part of that name keeps
// its place and gets the new text; a new one goes after every part whose order is
// at most Order.
type RulePart struct {
	Name  string
	Order float64
	Text  string
}

// RuleValue is a variable SetVariables sets: to the value of its CEL string
// Expression, or, with Unset, to no value.
type RuleValue struct {
	Name       string
	Expression string
	Unset      bool
}

// Mutation is one operation of a rule; made by the constructors, never by hand
// (a zero Mutation is refused).
type Mutation struct {
	message *pb.RuleMutation
}

// DropTools removes the tools for which predicate (CEL over tool) is true.
func DropTools(predicate string) Mutation {
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_DropTools{DropTools: predicate}}}
}

// KeepTools keeps only the tools for which predicate (CEL over tool) is true.
func KeepTools(predicate string) Mutation {
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_KeepTools{KeepTools: predicate}}}
}

// OrderTools puts these tools first, in this order (absent names passed over);
// every other tool follows, as it was (the proto's tool_order).
func OrderTools(names ...string) Mutation {
	order := &pb.RuleToolOrder{Names: append([]string(nil), names...)}
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_ToolOrder{ToolOrder: order}}}
}

// UpsertSections adds or replaces sections by name.
func UpsertSections(parts ...RulePart) Mutation {
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_UpsertSections{UpsertSections: ruleParts(parts)}}}
}

// DropSections removes the sections for which predicate (CEL over section) is true.
func DropSections(predicate string) Mutation {
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_DropSections{DropSections: predicate}}}
}

// UpsertContexts adds or replaces runtime contexts by name.
func UpsertContexts(parts ...RulePart) Mutation {
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_UpsertContexts{UpsertContexts: ruleParts(parts)}}}
}

// DropContexts removes the runtime contexts for which predicate (CEL over context) is true.
func DropContexts(predicate string) Mutation {
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_DropContexts{DropContexts: predicate}}}
}

// SetVariables gives each variable the value of its CEL string expression, or no
// value (RuleValue.Unset); a variable not in the assembly is added after the others.
func SetVariables(values ...RuleValue) Mutation {
	message := &pb.RuleVariableValues{}
	for _, value := range values {
		variable := &pb.RuleVariableValue{Name: value.Name}
		if value.Unset {
			variable.Value = &pb.RuleVariableValue_Unset{Unset: &pb.NoValue{}}
		} else {
			variable.Value = &pb.RuleVariableValue_Expression{Expression: value.Expression}
		}
		message.Variables = append(message.Variables, variable)
	}
	return Mutation{&pb.RuleMutation{Operation: &pb.RuleMutation_SetVariables{SetVariables: message}}}
}

func ruleParts(parts []RulePart) *pb.RuleParts {
	message := &pb.RuleParts{}
	for _, part := range parts {
		message.Parts = append(message.Parts, &pb.RulePart{Name: part.Name, Order: part.Order, Text: part.Text})
	}
	return message
}

// RuleOption configures Rule: Prepend and Global, the places a listener takes too.
type RuleOption interface {
	applyRule(request *pb.RegisterRuleRequest)
}

// StepOption places a waterfall step, a listener (OnAssemble) or a rule (Rule).
type StepOption interface {
	ListenerOption
	RuleOption
}

// stepFlag is a StepOption: prepend, global, or both.
type stepFlag struct{ prepend, global bool }

func (f stepFlag) applyListener(start *pb.ListenStart, _ *asked) {
	start.Prepend, start.Global = start.Prepend || f.prepend, start.Global || f.global
}

func (f stepFlag) applyRule(request *pb.RegisterRuleRequest) {
	request.Prepend, request.Global = request.Prepend || f.prepend, request.Global || f.global
}

// Rule registers a rule named name: a waterfall step the sidecar runs itself, in
// the one order with the listeners (Prepend runs it before the steps registered
// earlier; through a scope it runs in that scope's assemblies and below, Global in
// every one). The handle's Update replaces what it does in place; Dispose removes it.
func (r *registrar) Rule(ctx context.Context, name string, rule Rule, opts ...RuleOption) (*Handle[Rule], error) {
	spec, err := rule.toProto()
	if err != nil {
		return nil, err
	}
	request := &pb.RegisterRuleRequest{Name: name, Rule: spec}
	for _, opt := range opts {
		opt.applyRule(request)
	}
	return registerValue(ctx, r, request, "", r.c.rpc.RegisterRule, func(rule Rule) (*pb.UpdateRequest, func(), error) {
		spec, err := rule.toProto()
		if err != nil {
			return nil, nil, err
		}
		apply := func() { request.Rule = spec } // a replay registers what it is now
		return &pb.UpdateRequest{Value: &pb.UpdateRequest_Rule{Rule: spec}}, apply, nil
	})
}

// toProto is the rule as sent, or INVALID_VALUE for what cannot be.
func (rule Rule) toProto() (*pb.RuleSpec, error) {
	spec := &pb.RuleSpec{Match: append([]string(nil), rule.Match...)}
	switch rule.FailurePolicy {
	case "":
	case FailurePolicyFail, FailurePolicyIgnore:
		spec.FailurePolicy = failurePolicies[rule.FailurePolicy]
	default:
		return nil, invalid("a rule's FailurePolicy is FailurePolicyFail or FailurePolicyIgnore, not %q", rule.FailurePolicy)
	}
	for _, variable := range rule.Variables {
		spec.Variables = append(spec.Variables, &pb.RuleVariable{Name: variable.Name, Expression: variable.Expression})
	}
	for i, mutation := range rule.Mutations {
		if mutation.message == nil {
			return nil, invalid("a rule's Mutations[%d] is a zero Mutation: make it with DropTools, KeepTools, ...", i)
		}
		for _, parts := range []*pb.RuleParts{mutation.message.GetUpsertSections(), mutation.message.GetUpsertContexts()} {
			for _, part := range parts.GetParts() {
				if math.IsNaN(part.Order) || math.IsInf(part.Order, 0) {
					return nil, invalid("a rule part's order must be finite, not %v", part.Order)
				}
			}
		}
		spec.Mutations = append(spec.Mutations, mutation.message)
	}
	return spec, nil
}

// ruleFromProto is a rule as a listing shows it.
func ruleFromProto(spec *pb.RuleSpec) Rule {
	rule := Rule{Match: spec.GetMatch(), FailurePolicy: FailurePolicyFail}
	if spec.GetFailurePolicy() == pb.FailurePolicy_FAILURE_POLICY_IGNORE {
		rule.FailurePolicy = FailurePolicyIgnore
	}
	for _, variable := range spec.GetVariables() {
		rule.Variables = append(rule.Variables, RuleVariable{Name: variable.GetName(), Expression: variable.GetExpression()})
	}
	for _, mutation := range spec.GetMutations() {
		rule.Mutations = append(rule.Mutations, Mutation{mutation})
	}
	return rule
}
