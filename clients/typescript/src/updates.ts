/** Updates: a registration's new static value, on the wire and in what a replay makes. */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { toolsToProto } from "./convert.js";
import { invalid } from "./errors.js";
import { ruleSpec, type Rule } from "./rules.js";

/** A request that makes a registration whose value can be updated. */
export type UpdatableRequest =
  | pb.RegisterSectionRequest
  | pb.RegisterContextRequest
  | pb.RegisterVariableRequest
  | pb.RegisterToolsRequest
  | pb.RegisterRuleRequest;

/** What to send, and how to make the registration's request carry the new value. */
export interface Update {
  request: pb.UpdateRequest;
  /** Run once the sidecar took it, so that a replay registers it. */
  apply(): void;
}

/**
 * The update of the registration made by `registration` to the static `value`.
 * A section or context takes a string, a variable a string or undefined, tools a
 * list of schemas or a ToolProviderResult, a rule a Rule; anything else is refused here.
 */
export function updateFor(registration: UpdatableRequest, value: unknown): Update {
  if (typeof value === "function") {
    throw invalid("update() takes a static value; a provider already gives the latest value at each assembly");
  }
  if (registration.$typeName === "dsh.systemprompt.v1.RegisterRuleRequest") {
    const rule = ruleSpec(value as Rule);
    return {
      request: create(pb.UpdateRequestSchema, { value: { case: "rule", value: rule } }),
      apply: () => {
        registration.rule = rule;
      },
    };
  }
  if (registration.$typeName === "dsh.systemprompt.v1.RegisterToolsRequest") {
    const tools = toolsToProto(value as Parameters<typeof toolsToProto>[0]);
    return {
      request: create(pb.UpdateRequestSchema, { value: { case: "tools", value: tools } }),
      apply: () => {
        registration.source = { case: "result", value: tools };
      },
    };
  }
  if (registration.$typeName === "dsh.systemprompt.v1.RegisterVariableRequest") {
    if (value === undefined || value === null) {
      return {
        request: create(pb.UpdateRequestSchema, { value: { case: "noValue", value: create(pb.NoValueSchema) } }),
        apply: () => {
          registration.valueSource = { case: "noValue", value: create(pb.NoValueSchema) };
        },
      };
    }
    const text = checkText(value, "value");
    return {
      request: create(pb.UpdateRequestSchema, { value: { case: "text", value: text } }),
      apply: () => {
        registration.valueSource = { case: "value", value: text };
      },
    };
  }
  const text = checkText(value, "text");
  return {
    request: create(pb.UpdateRequestSchema, { value: { case: "text", value: text } }),
    apply: () => {
      registration.textSource = { case: "text", value: text };
    },
  };
}

function checkText(value: unknown, field: string): string {
  if (typeof value !== "string") throw invalid(`the new ${field} must be a string, not ${typeof value}`);
  return value;
}
