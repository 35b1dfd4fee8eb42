/** Client value types <-> protobuf messages. */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { invalid } from "./errors.js";
import {
  ChangeAction,
  ChangeKind,
  PartKind,
  PrefixLayout,
  SourceKind,
  ToolFreeze,
  ToolSchema,
  type AssembleContext,
  type AssemblyReport,
  type ChangeEvent,
  type SkippedStep,
  type JsonObject,
  type PromptAssembly,
  type Size,
  type Source,
  type ToolOrderReport,
  type ToolProviderResult,
  type ToolSchemaLike,
} from "./types.js";

// The wire's numbers to the client's names (test/enums.test.ts checks each covers its enum).
export const CHANGE_KINDS: Record<number, ChangeKind> = {
  [pb.ChangeKind.SECTION]: ChangeKind.SECTION,
  [pb.ChangeKind.CONTEXT]: ChangeKind.CONTEXT,
  [pb.ChangeKind.TOOLS]: ChangeKind.TOOLS,
  [pb.ChangeKind.VARIABLE]: ChangeKind.VARIABLE,
  [pb.ChangeKind.SUPPRESSOR]: ChangeKind.SUPPRESSOR,
  [pb.ChangeKind.LISTENER]: ChangeKind.LISTENER,
  [pb.ChangeKind.SCOPE]: ChangeKind.SCOPE,
  [pb.ChangeKind.CONFIG]: ChangeKind.CONFIG,
  [pb.ChangeKind.RULE]: ChangeKind.RULE,
};
export const CHANGE_ACTIONS: Record<number, ChangeAction> = {
  [pb.ChangeAction.REGISTERED]: ChangeAction.REGISTERED,
  [pb.ChangeAction.UNREGISTERED]: ChangeAction.UNREGISTERED,
  [pb.ChangeAction.UPDATED]: ChangeAction.UPDATED,
};
export const LAYOUTS: Record<number, PrefixLayout> = {
  [pb.PrefixLayout.TOOLS_FIRST]: PrefixLayout.TOOLS_FIRST,
  [pb.PrefixLayout.SYSTEM_FIRST]: PrefixLayout.SYSTEM_FIRST,
};
export const SOURCE_KINDS: Record<number, SourceKind> = {
  [pb.SourceKind.BUILTIN]: SourceKind.BUILTIN,
  [pb.SourceKind.GLOBAL]: SourceKind.GLOBAL,
  [pb.SourceKind.SCOPE]: SourceKind.SCOPE,
  [pb.SourceKind.LISTENER]: SourceKind.LISTENER,
  [pb.SourceKind.RULE]: SourceKind.RULE,
};
export const PART_KINDS: Record<number, PartKind> = {
  [pb.PartKind.TOOL]: PartKind.TOOL,
  [pb.PartKind.SECTION]: PartKind.SECTION,
  [pb.PartKind.CONTEXT]: PartKind.CONTEXT,
};

/** Deterministic JSON text; key order is kept so schemas stay byte-identical. */
export function dumpJson(value: unknown, what: string): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value, (_key, item: unknown) => {
      if (typeof item === "number" && !Number.isFinite(item)) throw new Error(`${item} is not JSON`);
      if (typeof item === "bigint") throw new Error("a bigint is not JSON");
      return item;
    });
  } catch (error) {
    throw invalid(`${what} cannot be sent as JSON: ${(error as Error).message}`);
  }
  if (text === undefined) throw invalid(`${what} cannot be sent as JSON: ${String(value)}`);
  return text;
}

export function toolToProto(tool: ToolSchemaLike): pb.ToolSchema {
  if (tool === null || typeof tool !== "object" || typeof tool.name !== "string") {
    throw invalid(`expected a tool schema {name, description, parameters}, got ${String(tool)}`);
  }
  const parametersJson =
    (tool instanceof ToolSchema ? tool.parametersJson() : undefined) ??
    dumpJson(tool.parameters ?? {}, `tool "${tool.name}" parameters`);
  return create(pb.ToolSchemaSchema, {
    name: tool.name,
    description: tool.description ?? "",
    parametersJson,
  });
}

export function toolsToProto(result: ToolProviderResult | ToolSchemaLike[]): pb.ToolProviderResult {
  const value = Array.isArray(result) ? { schemas: result } : result;
  if (value === null || typeof value !== "object" || !Array.isArray(value.schemas)) {
    throw invalid(`expected a ToolProviderResult or an array of tool schemas, got ${String(result)}`);
  }
  const message = create(pb.ToolProviderResultSchema, { schemas: value.schemas.map(toolToProto) });
  if (value.knownNames !== undefined) {
    message.knownNames = create(pb.KnownNamesSchema, { names: [...value.knownNames] });
  }
  return message;
}

export function toolsetFromProto(message: pb.ToolProviderResult): ToolProviderResult {
  const result: ToolProviderResult = { schemas: message.schemas.map(toolFromProto) };
  if (message.knownNames !== undefined) result.knownNames = [...message.knownNames.names];
  return result;
}

export function toolFromProto(message: pb.ToolSchema): ToolSchema {
  return ToolSchema.fromJson(message.name, message.description, message.parametersJson);
}

/** The assembly in `message`; `tools` when the caller already decoded them. */
export function assemblyFromProto(
  message: pb.PromptAssembly | undefined,
  tools?: ToolSchemaLike[],
): PromptAssembly {
  const variables: Record<string, string | undefined> = {};
  for (const variable of message?.variables ?? []) variables[variable.name] = variable.value;
  return {
    sections: (message?.sections ?? []).map(({ name, text }) => ({ name, text })),
    contexts: (message?.contexts ?? []).map(({ name, text }) => ({ name, text })),
    tools: tools === undefined ? (message?.tools ?? []).map(toolFromProto) : [...tools],
    variables,
  };
}

export function assemblyToProto(assembly: PromptAssembly): pb.PromptAssembly {
  if (assembly === null || typeof assembly !== "object" || !Array.isArray(assembly.sections)) {
    throw invalid(`a listener must return a PromptAssembly, not ${String(assembly)}`);
  }
  return create(pb.PromptAssemblySchema, {
    sections: assembly.sections.map(({ name, text }) => ({ name, text })),
    contexts: (assembly.contexts ?? []).map(({ name, text }) => ({ name, text })),
    tools: (assembly.tools ?? []).map(toolToProto),
    variables: Object.entries(assembly.variables ?? {}).map(([name, value]) =>
      value === undefined || value === null ? { name } : { name, value },
    ),
  });
}

export function contextToProto(scope: string | undefined, fields: JsonObject | undefined): pb.AssembleContext {
  const fieldsJson = fields && Object.keys(fields).length ? dumpJson(fields, "assemble fields") : "";
  return create(pb.AssembleContextSchema, { scope: scope ?? "", fieldsJson });
}

export function contextFromProto(message: pb.AssembleContext | undefined, signal: AbortSignal): AssembleContext {
  const fields = message?.fieldsJson ? (JSON.parse(message.fieldsJson) as JsonObject) : {};
  return { ...fields, scope: message?.scope || undefined, fields, signal };
}

export function changeFromProto(message: pb.ChangeEvent): ChangeEvent {
  return {
    type: "change",
    revision: Number(message.revision),
    kind: CHANGE_KINDS[message.kind] ?? "unknown",
    action: CHANGE_ACTIONS[message.action] ?? "unknown",
    name: message.name,
    scope: message.scope || undefined,
    ref: message.ref,
    fingerprint: message.fingerprint,
    ...(message.reason ? { reason: message.reason } : {}),
    ...(message.reboundScopes.length ? { reboundScopes: [...message.reboundScopes] } : {}),
    ...(message.global === undefined ? {} : { global: message.global }),
  };
}

export function reportFromProto(message: pb.AssemblyReport): AssemblyReport {
  const stability = message.stability;
  const variables: Record<string, Source> = {};
  for (const variable of message.variables) variables[variable.name] = source(variable.source);
  return {
    tokenizer: message.tokenizer,
    parts: message.parts.map((part) => ({
      kind: PART_KINDS[part.kind] ?? "unknown",
      name: part.name,
      source: source(part.source),
      bytes: Number(part.bytes),
      tokens: optionalNumber(part.tokens),
      fingerprint: part.fingerprint,
      stable: part.stable,
    })),
    tools: sizeFromProto(message.tools),
    prompt: sizeFromProto(message.prompt),
    contextSnapshot: sizeFromProto(message.contextSnapshot),
    stability: {
      hasPrevious: stability?.hasPrevious ?? false,
      stableBytes: Number(stability?.stableBytes ?? 0),
      stableTokens: optionalNumber(stability?.stableTokens),
      prefix: sizeFromProto(stability?.prefix),
      firstChanged: stability?.firstChanged ?? "",
      reason: stability?.reason ?? "",
      recomputed: sizeFromProto(stability?.recomputed),
      messagesRecomputed: stability?.messagesRecomputed ?? false,
      diff: stability?.diff ?? "",
      previousEvicted: stability?.previousEvicted ?? false,
    },
    variables,
    renderError: message.renderError,
    prefixLayout: layoutFromProto(message.prefixLayout),
    historyKey: message.historyKey,
    skipped: skippedFromProto(message.skipped),
    toolOrder: message.toolOrder === undefined ? undefined : toolOrderFromProto(message.toolOrder),
  };
}

function toolOrderFromProto(order: pb.ToolOrderReport): ToolOrderReport {
  return { kept: order.kept, position: order.position, sortedTool: order.sortedTool, keptTool: order.keptTool };
}

export function skippedFromProto(steps: pb.SkippedStep[]): SkippedStep[] {
  return steps.map((step) => ({
    name: step.name,
    ref: step.ref,
    kind: CHANGE_KINDS[step.kind] ?? "unknown",
    scope: step.scope || undefined,
    reason: step.reason,
    message: step.message,
  }));
}

function source(message: pb.Source | undefined): Source {
  return {
    kind: SOURCE_KINDS[message?.kind ?? 0] ?? "unknown",
    scope: message?.scope || undefined,
    ancestorDepth: message?.ancestorDepth ?? 0,
    listener: message?.listener ?? "",
    description: message?.description ?? "",
  };
}

export function layoutFromProto(layout: pb.PrefixLayout): PrefixLayout {
  return LAYOUTS[layout] ?? "system-first";
}

/** The wire layout; undefined is the sidecar's configured one. */
export function layoutToProto(layout: PrefixLayout | undefined): pb.PrefixLayout {
  if (layout === undefined) return pb.PrefixLayout.UNSPECIFIED;
  for (const [wire, name] of Object.entries(LAYOUTS)) if (name === layout) return Number(wire);
  throw invalid(`prefixLayout must be one of ${Object.values(LAYOUTS).join(", ")}, not ${String(layout)}`);
}

/** The client's names for the wire's tool freezes (test/enums.test.ts checks them). */
export const TOOL_FREEZES: Record<ToolFreeze, pb.ToolFreeze> = {
  [ToolFreeze.HOLD]: pb.ToolFreeze.HOLD,
  [ToolFreeze.RELEASE]: pb.ToolFreeze.RELEASE,
};

/** The wire's tool freeze; undefined is none. */
export function freezeToProto(freeze: ToolFreeze | undefined): pb.ToolFreeze {
  if (freeze === undefined) return pb.ToolFreeze.UNSPECIFIED;
  // a caller without the types may pass anything: only an own key is a freeze
  if (Object.hasOwn(TOOL_FREEZES, freeze)) return TOOL_FREEZES[freeze];
  throw invalid(`toolFreeze must be one of ${Object.keys(TOOL_FREEZES).join(", ")}, not ${String(freeze)}`);
}

export function sizeFromProto(message: pb.Size | undefined): Size {
  return { bytes: Number(message?.bytes ?? 0), tokens: optionalNumber(message?.tokens) };
}

function optionalNumber(value: bigint | undefined): number | undefined {
  return value === undefined ? undefined : Number(value);
}
