/**
 * Rules: waterfall steps the sidecar runs itself, in CEL (docs/protocol.md, "Rules").
 *
 * A {@link Rule} is what a rule does, {@link Mutation}'s constructors its operations (one
 * each, applied in order), a {@link RulePart} a part an upsert adds or replaces. The
 * expressions are CEL source text, compiled and checked by the sidecar when the rule is
 * registered or updated (RULE_INVALID naming the rule and the expression); a malformed
 * value is refused here first (INVALID_VALUE), as in the Python client.
 *
 * ```ts
 * const off = await client.rule("no-web", {
 *   match: ["'mode' in fields && fields.mode == 'offline'"],
 *   mutations: [dsp.Mutation.dropTools("tool.name.startsWith('web_')")],
 * });
 * await off.update({ mutations: [dsp.Mutation.dropTools("tool.name == 'web_fetch'")] });
 * await off();
 * ```
 */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { invalid } from "./errors.js";

/** FailurePolicy's values (types.ts, which imports this module for its listings' Rule). */
type FailurePolicy = "fail" | "ignore";

/**
 * A section or context an upsert adds or replaces: `text` is a CEL string expression
 * (`"'Be brief.'"`, `"'Agent ' + fields.agent"`). A part of that name keeps its place and gets
 * the new text; a new one goes after every part whose order is at most `order`.
 */
export interface RulePart {
  name: string;
  order: number;
  text: string;
}

/** What a rule does: when every `match` expression is true, its `mutations` in order. */
export interface Rule {
  /** Applied in order, each on what the one before it left; made by {@link Mutation}. */
  mutations?: readonly Mutation[] | undefined;
  /** CEL booleans: when any is false the rule leaves the assembly as it is. */
  match?: readonly string[] | undefined;
  /** Named CEL sub-expressions, read as `variables.NAME` (each by those before it). */
  variables?: Readonly<Record<string, string>> | undefined;
  /** "ignore": a rule that fails at run time is passed over; "fail" (the default) fails the assembly. */
  failurePolicy?: FailurePolicy | undefined;
}

/** A rule's registration options (the place it takes among the waterfall's steps). */
export interface RuleOptions {
  /** Run before the listeners and rules registered earlier. */
  prepend?: boolean | undefined;
  /** On a scope: run in every assembly anyway. */
  global?: boolean | undefined;
}

/** One operation of a rule; made by the static constructors, never by hand. */
export class Mutation {
  /** The operation as sent. */
  readonly message: pb.RuleMutation;

  private constructor(operation: pb.RuleMutation["operation"]) {
    this.message = create(pb.RuleMutationSchema, { operation });
  }

  /** Remove the tools for which `predicate` (CEL over `tool`) is true. */
  static dropTools(predicate: string): Mutation {
    return new Mutation({ case: "dropTools", value: text(predicate) });
  }

  /** Keep only the tools for which `predicate` (CEL over `tool`) is true. */
  static keepTools(predicate: string): Mutation {
    return new Mutation({ case: "keepTools", value: text(predicate) });
  }

  /** These tools first, in this order; every other tool after them, as it was. */
  static toolOrder(names: readonly string[]): Mutation {
    const listed = list(names, "toolOrder").map((name) => text(name, "tool name"));
    return new Mutation({ case: "toolOrder", value: create(pb.RuleToolOrderSchema, { names: listed }) });
  }

  /** Add or replace sections by name. */
  static upsertSections(...parts: RulePart[]): Mutation {
    return new Mutation({ case: "upsertSections", value: ruleParts(parts) });
  }

  /** Remove the sections for which `predicate` (CEL over `section`) is true. */
  static dropSections(predicate: string): Mutation {
    return new Mutation({ case: "dropSections", value: text(predicate) });
  }

  /** Add or replace runtime contexts by name. */
  static upsertContexts(...parts: RulePart[]): Mutation {
    return new Mutation({ case: "upsertContexts", value: ruleParts(parts) });
  }

  /** Remove the runtime contexts for which `predicate` (CEL over `context`) is true. */
  static dropContexts(predicate: string): Mutation {
    return new Mutation({ case: "dropContexts", value: text(predicate) });
  }

  /** Give each variable the value of its CEL string expression, or undefined / null: no value. */
  static setVariables(values: Readonly<Record<string, string | undefined | null>>): Mutation {
    if (typeof values !== "object" || values === null || Array.isArray(values)) {
      throw invalid("setVariables takes an object of names to expressions or undefined");
    }
    const variables = Object.entries(values).map(([name, expression]) =>
      create(pb.RuleVariableValueSchema, {
        name: text(name, "variable name"),
        value:
          expression === undefined || expression === null
            ? { case: "unset", value: create(pb.NoValueSchema) }
            : { case: "expression", value: text(expression) },
      }),
    );
    return new Mutation({ case: "setVariables", value: create(pb.RuleVariableValuesSchema, { variables }) });
  }

  /** A mutation as a listing shows it. */
  static fromProto(message: pb.RuleMutation): Mutation {
    return new Mutation(message.operation);
  }
}

const POLICIES: Record<FailurePolicy, pb.FailurePolicy> = {
  fail: pb.FailurePolicy.FAIL,
  ignore: pb.FailurePolicy.IGNORE,
};

/** A rule as sent; anything malformed is refused here (INVALID_VALUE). */
export function ruleSpec(rule: Rule): pb.RuleSpec {
  if (typeof rule !== "object" || rule === null || Array.isArray(rule)) {
    throw invalid(`a rule is an object ({ mutations, match, variables, failurePolicy }), not ${typeof rule}`);
  }
  const policy: unknown = rule.failurePolicy;
  if (policy !== undefined && policy !== "fail" && policy !== "ignore") {
    throw invalid(`failurePolicy must be "fail" or "ignore", not ${String(policy)}`);
  }
  const variables = rule.variables ?? {};
  if (typeof variables !== "object" || variables === null || Array.isArray(variables)) {
    throw invalid("a rule's variables are an object of names to expressions");
  }
  const mutations = list(rule.mutations ?? [], "mutations").map((mutation) => {
    if (!(mutation instanceof Mutation)) {
      throw invalid(`a rule's mutations are made by dsp.Mutation, not ${typeof mutation}`);
    }
    return mutation.message;
  });
  return create(pb.RuleSpecSchema, {
    match: list(rule.match ?? [], "match").map((source) => text(source)),
    variables: Object.entries(variables).map(([name, expression]) =>
      create(pb.RuleVariableSchema, { name: text(name, "variable name"), expression: text(expression) }),
    ),
    mutations,
    failurePolicy: policy === undefined ? pb.FailurePolicy.UNSPECIFIED : POLICIES[policy],
  });
}

/** A rule as a listing shows it (its value, with `values: true`). */
export function ruleFromProto(spec: pb.RuleSpec): Rule {
  return {
    mutations: spec.mutations.map((mutation) => Mutation.fromProto(mutation)),
    match: [...spec.match],
    variables: Object.fromEntries(spec.variables.map((variable) => [variable.name, variable.expression])),
    failurePolicy: spec.failurePolicy === pb.FailurePolicy.IGNORE ? "ignore" : "fail",
  };
}

function ruleParts(parts: readonly RulePart[]): pb.RuleParts {
  return create(pb.RulePartsSchema, {
    parts: parts.map((part) => {
      if (typeof part !== "object" || part === null) throw invalid(`an upsert takes RulePart objects, not ${typeof part}`);
      const order: unknown = part.order;
      if (typeof order !== "number" || !Number.isFinite(order)) {
        throw invalid(`a rule part's order must be a finite number, not ${String(order)}`);
      }
      return create(pb.RulePartSchema, { name: text(part.name, "name"), order, text: text(part.text) });
    }),
  });
}

function list<T>(values: readonly T[], what: string): readonly T[] {
  if (!Array.isArray(values)) throw invalid(`a rule's ${what} is an array, not ${typeof values}`);
  return values;
}

function text(value: unknown, what = "expression"): string {
  if (typeof value !== "string") throw invalid(`a rule's ${what} must be a string, not ${typeof value}`);
  return value;
}
