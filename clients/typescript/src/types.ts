/** The client's value types: plain data, shaped like the registry's original TypeScript API. */

import type { Rule } from "./rules.js";

/** The reserved rest entry of a configured tool order. */
export const TOOL_ORDER_REST = "<unlisted-tools>";
/** The name of the sidecar's built-in persona section. */
export const PERSONA_SECTION = "deployment:persona";
/** The order of the built-in persona section. */
export const PERSONA_ORDER = 0;

/** A JSON object, as tool parameters and assemble fields are. */
export type JsonObject = { [key: string]: unknown };

/** A prompt section as assembled: text resolved, not yet interpolated. */
export interface AssembledSection {
  name: string;
  text: string;
}

/** A runtime context as assembled: text resolved, not yet interpolated. */
export interface AssembledContext {
  name: string;
  text: string;
}

/** A tool as the model sees it, in any shape: a plain object or a {@link ToolSchema}. */
export interface ToolSchemaLike {
  name: string;
  description: string;
  /** The JSON Schema of the tool's parameters (an object). */
  parameters: JsonObject;
}

/**
 * A tool as the model sees it; `parameters` is a JSON Schema object.
 *
 * Received schemas keep their JSON text and parse it only when `parameters`
 * is first read, so passing tools along (listeners, adapters that send the
 * JSON on) costs no parsing and stays byte-identical.
 */
export class ToolSchema implements ToolSchemaLike {
  name: string;
  description: string;
  #parameters: JsonObject | undefined;
  #json: string | undefined;

  constructor(name: string, description: string, parameters: JsonObject = {}) {
    this.name = name;
    this.description = description;
    this.#parameters = parameters;
    this.#json = undefined;
  }

  /** A schema whose parameters are JSON text, parsed when first read. */
  static fromJson(name: string, description: string, parametersJson: string): ToolSchema {
    const tool = new ToolSchema(name, description);
    tool.#parameters = undefined;
    tool.#json = parametersJson;
    return tool;
  }

  /** The JSON Schema of the tool's parameters. */
  get parameters(): JsonObject {
    if (this.#parameters === undefined) {
      this.#parameters = JSON.parse(this.#json ?? "{}") as JsonObject;
      this.#json = undefined; // the object may now change: it is the truth from here on
    }
    return this.#parameters;
  }

  set parameters(value: JsonObject) {
    this.#parameters = value;
    this.#json = undefined;
  }

  /** The JSON text as received, while `parameters` has not been read; else undefined. */
  parametersJson(): string | undefined {
    return this.#json;
  }

  /** `JSON.stringify(tool)` gives `{name, description, parameters}`. */
  toJSON(): ToolSchemaLike {
    return { name: this.name, description: this.description, parameters: this.parameters };
  }
}

/** A tool provider's answer: the visible schemas, and the pre-restriction names. */
export interface ToolProviderResult {
  schemas: ToolSchemaLike[];
  /** The pre-restriction universe the tool order is checked against; default: the schemas' names. */
  knownNames?: string[] | undefined;
}

/**
 * What one assembly is for: the scope and the caller's free-form fields.
 *
 * As in the original API, the fields can also be read directly on the context
 * (`context.cwd`), besides `context.fields.cwd`; `scope` and `fields` win a clash.
 */
export interface AssembleContext {
  [field: string]: unknown;
  /** The scope key whose layers join the global one; undefined for none. */
  scope?: string | undefined;
  /** The caller's free-form fields (a JSON object). */
  fields: JsonObject;
  /** Aborted when the sidecar gives up on this assembly (it ended or was cancelled). */
  signal: AbortSignal;
}

/** Where a part came from (the proto's `SourceKind`); "unknown": a newer sidecar's kind. */
export type SourceKind = "builtin" | "global" | "scope" | "listener" | "rule" | "unknown";

/** The source kinds by name, one per value of the proto's enum: `source.kind === SourceKind.SCOPE`. */
export const SourceKind = Object.freeze({
  BUILTIN: "builtin",
  GLOBAL: "global",
  SCOPE: "scope",
  LISTENER: "listener",
  RULE: "rule",
  UNKNOWN: "unknown",
} as const);

/** Where an assembled part came from. */
export interface Source {
  kind: SourceKind;
  /** For "scope": the layer's scope key. */
  scope?: string | undefined;
  /** For "scope": 0 is the assembly's own scope, 1 its parent, and so on. */
  ancestorDepth: number;
  /** For "listener": the listener that added or last changed it. */
  listener: string;
  /** The same in words. */
  description: string;
}

/** A size in UTF-8 bytes and, where the sidecar has a tokenizer, in tokens. */
export interface Size {
  bytes: number;
  tokens?: number | undefined;
}

/** What a reported part is (the proto's `PartKind`); "unknown": a newer sidecar's kind. */
export type PartKind = "tool" | "section" | "context" | "unknown";

/** The part kinds by name, one per value of the proto's enum: `part.kind === PartKind.TOOL`. */
export const PartKind = Object.freeze({
  TOOL: "tool",
  SECTION: "section",
  CONTEXT: "context",
  UNKNOWN: "unknown",
} as const);

/** One rendered part, in model order: its origin, size, fingerprint and stability. */
export interface PartReport {
  kind: PartKind;
  name: string;
  source: Source;
  bytes: number;
  tokens?: number | undefined;
  fingerprint: string;
  stable: boolean;
}

/** The order a model server caches a request's prefix in (see docs/prompt-cache.md). */
export type PrefixLayout = "tools-first" | "system-first";

/** The prefix layouts by name, one per value of the proto's enum: `{ prefixLayout: PrefixLayout.TOOLS_FIRST }`. */
export const PrefixLayout = Object.freeze({ TOOLS_FIRST: "tools-first", SYSTEM_FIRST: "system-first" } as const);

/**
 * What a reported assembly does to its history key's tool freeze (docs/prompt-cache.md,
 * "Freezing the tools"): "hold" freezes the key's tools as this assembly has them, unless
 * frozen already (a later reported assembly whose tools differ rejects TOOLS_FROZEN);
 * "release" releases the freeze before this assembly (e.g. at compaction).
 */
export type ToolFreeze = "hold" | "release";

/** The tool freezes by name, one per value of the proto's enum: `{ toolFreeze: ToolFreeze.HOLD }`. */
export const ToolFreeze = Object.freeze({ HOLD: "hold", RELEASE: "release" } as const);

/** How much of the prefix (in the report's layout) is unchanged since the previous report. */
export interface PrefixStability {
  hasPrevious: boolean;
  stableBytes: number;
  stableTokens?: number | undefined;
  prefix: Size;
  /** E.g. `section "cwd"`; "" when nothing changed. */
  firstChanged: string;
  /** E.g. `section "cwd" text changed (variable {{cwd}} changed)`. */
  reason: string;
  /** What the first change makes the model server recompute of the prefix. */
  recomputed: Size;
  /** Every message after the system prompt is recomputed too. */
  messagesRecomputed: boolean;
  /** A short -/+ diff of the first changed part. */
  diff: string;
  /** An earlier report existed but was evicted. */
  previousEvicted: boolean;
}

/** Provenance, sizes and prefix stability of one assembly (`assemble({report: true})`). */
export interface AssemblyReport {
  /** "" when sizes are bytes only. */
  tokenizer: string;
  parts: PartReport[];
  tools: Size;
  prompt: Size;
  contextSnapshot: Size;
  stability: PrefixStability;
  variables: Record<string, Source>;
  /** Why the assembly does not render, naming the part; "" when it does. */
  renderError: string;
  prefixLayout: PrefixLayout;
  /** The history key compared with: `scope "agent-1"`, `key "conv-7"`. */
  historyKey: string;
  /** The steps the assembly went on without (as `assembly.skipped`). */
  skipped: SkippedStep[];
  /** How the tools kept the history key's order; set only when the sidecar keeps a stable order. */
  toolOrder?: ToolOrderReport | undefined;
}

/**
 * A stably ordered assembly's tools (config `tool_order_mode = "stable"`) against the order
 * sorting gave: `kept` when they differ, then the first `position` (0-based) where they do,
 * the tool sorting would have put there and the one kept there.
 */
export interface ToolOrderReport {
  kept: boolean;
  position: number;
  sortedTool: string;
  keptTool: string;
}

/**
 * What an assembly does when a provider or listener fails or does not answer in time
 * (docs/protocol.md, "Failure policy"), as a Kubernetes admission webhook's
 * `failurePolicy`: "fail" (the default: the assembly fails, naming it) or "ignore"
 * (it goes on without the callback's step and says so in `assembly.skipped`; only for a
 * callback that decorates the prompt, never one that filters it).
 */
export type FailurePolicy = "fail" | "ignore";

/** The failure policies by name: `{ failurePolicy: FailurePolicy.IGNORE }`. */
export const FailurePolicy = Object.freeze({ FAIL: "fail", IGNORE: "ignore" } as const);

/** A step an assembly went on without: a callback under "ignore" that failed. */
export interface SkippedStep {
  /** A provider's kind ("section", "context", "tools", "variable") or "listener". */
  kind: ChangeKind;
  /** Its name, or the label of a tool provider or listener. */
  name: string;
  /** The scope whose layer holds it; undefined for the global layer. */
  scope: string | undefined;
  /** Its public reference, as in change events and listings. */
  ref: string;
  /** Why: PROVIDER_FAILED, PROVIDER_TIMEOUT, LISTENER_FAILED, LISTENER_TIMEOUT, ... */
  reason: string;
  /** What the assembly would have failed with under "fail". */
  message: string;
}

/** How many steps of one kind a reported assembly went on without for one reason (a cache history's entry counts them; the steps themselves are in its report). */
export interface SkippedCount {
  /** As `SkippedStep.kind`. */
  kind: ChangeKind;
  /** As `SkippedStep.reason`. */
  reason: string;
  /** At least 1. */
  count: number;
}

/** What the model is told: sections, contexts, tools and resolved variables. */
export interface PromptAssembly {
  sections: AssembledSection[];
  contexts: AssembledContext[];
  tools: ToolSchemaLike[];
  /** Every variable resolved for this assembly; undefined means "no value for this assembly". */
  variables: Record<string, string | undefined>;
  /** Set when the assembly was asked for with `report: true`. */
  report?: AssemblyReport | undefined;
  /** The steps the sidecar's assembly went on without (callbacks under "ignore" that failed); unset when complete. */
  skipped?: SkippedStep[] | undefined;
}

/** An assembly rendered by the sidecar. */
export interface RenderedPrompt {
  prompt: string;
  contextSnapshot: string;
  assembly: PromptAssembly;
}

/** What a change event (or a listing's entry) is about; "unknown": a newer sidecar's kind. */
export type ChangeKind =
  | "section"
  | "context"
  | "tools"
  | "variable"
  | "suppressor"
  | "listener"
  | "scope"
  | "config"
  | "rule"
  | "unknown";

/** The change kinds by name, one per value of the proto's enum: `watchChanges({ kinds: [ChangeKind.SECTION] })`. */
export const ChangeKind = Object.freeze({
  SECTION: "section",
  CONTEXT: "context",
  TOOLS: "tools",
  VARIABLE: "variable",
  SUPPRESSOR: "suppressor",
  LISTENER: "listener",
  SCOPE: "scope",
  CONFIG: "config",
  RULE: "rule",
  UNKNOWN: "unknown",
} as const);

/** Registered, unregistered, updated in place; "unknown": a newer sidecar's action. */
export type ChangeAction = "registered" | "unregistered" | "updated" | "unknown";

/** The change actions by name, one per value of the proto's enum: `event.action === ChangeAction.UPDATED`. */
export const ChangeAction = Object.freeze({
  REGISTERED: "registered",
  UNREGISTERED: "unregistered",
  UPDATED: "updated",
  UNKNOWN: "unknown",
} as const);

/** One registration, update or disposal seen on the change stream. */
export interface ChangeEvent {
  type: "change";
  /** Grows by one with every change. */
  revision: number;
  kind: ChangeKind;
  action: ChangeAction;
  /** The section's, context's or variable's name, a scope's key, a provider's label. */
  name: string;
  /** The scope whose layer changed; undefined for the global layer. */
  scope?: string | undefined;
  /** The registration's public reference, as in {@link RegistrationInfo.ref}. */
  ref: string;
  /** Its value's fingerprint after the change; "" when gone or not static. */
  fingerprint: string;
  /** Why the sidecar disposed it on its own (an ejected callback); absent otherwise. */
  reason?: string;
  /** Scope keys whose parent binding it made or undid (their chains changed); absent: none. */
  reboundScopes?: string[];
  /**
   * It concerns every scope's assemblies (the global layer's, or a listener or rule that
   * runs everywhere); absent: not said, by a sidecar before `ChangeEvent.global`.
   */
  global?: boolean;
}

/**
 * The watcher fell behind: `count` events from `firstRevision` were dropped.
 * Re-read whatever state you track as of `resyncRevision`; events after it follow.
 */
export interface ChangesMissed {
  type: "missed";
  firstRevision: number;
  count: number;
  resyncRevision: number;
}

/**
 * The change stream could not be resumed event by event: rebuild your view from
 * `snapshot`. `reason` is "restarted" (a new sidecar incarnation: revisions began
 * again) or "behind" (the sidecar's history no longer holds the changes since the
 * last one delivered). The events after `snapshot.revision` follow.
 */
export interface ChangesResynced {
  type: "resynced";
  reason: "restarted" | "behind";
  snapshot: Snapshot;
}

/** One registration as a listing shows it (`client.snapshot()`). */
export interface RegistrationInfo {
  /** The same as {@link ChangeEvent.ref} of its events. */
  ref: string;
  kind: ChangeKind;
  name: string;
  scope?: string | undefined;
  order?: number | undefined;
  complete: boolean;
  dynamic: boolean;
  /** The owning session's client name. */
  owner: string;
  /** Tells sessions of one client name apart. */
  ownerLabel: string;
  sizeBytes: number;
  /** Equal for equal static values; "" for a dynamic one. */
  fingerprint: string;
  /** The listing asked for values and this one has a static value. */
  hasValue: boolean;
  /** The static value, when listed: a text, undefined ("no value"), a ToolProviderResult or a Rule. */
  value?: string | ToolProviderResult | Rule | undefined;
  /** A listener or rule that runs for every scope's assemblies (registered with `global`, or in the global layer). */
  global: boolean;
}

/** The registrations at `revision` of the sidecar incarnation `incarnation`. */
export interface Snapshot {
  revision: number;
  incarnation: string;
  registrations: RegistrationInfo[];
}

/**
 * One message of `client.watchPrompt()`: the scope's prompt from its static parts.
 * Dynamic parts hold placeholders (`<dynamic section "cwd">`); listeners are not run.
 * `report.stability` is the prompt-cache verdict against the previous message.
 */
export interface PromptChange {
  revision: number;
  incarnation: string;
  /** Undefined when the static parts do not assemble (see `error`). */
  assembly?: PromptAssembly | undefined;
  /** The rendered prompt, when asked for and it renders. */
  prompt?: string | undefined;
  contextSnapshot?: string | undefined;
  report?: AssemblyReport | undefined;
  /** The changes since the previous message, oldest first. */
  changes: ChangeEvent[];
  changesOmitted: number;
  /** Why the static parts do not assemble, or "". */
  error: string;
}

/** One reported assembly in a history key's prompt-cache history. */
export interface CacheHistoryEntry {
  /** 1 for the key's first report. */
  sequence: number;
  revision: number;
  prefixLayout: PrefixLayout;
  hasPrevious: boolean;
  firstChanged: string;
  reason: string;
  prefix: Size;
  stableBytes: number;
  /** Predicted cached tokens, with a tokenizer. */
  stableTokens?: number | undefined;
  recomputed: Size;
  /** What the model server said (`reportUsage`). */
  observedCachedTokens?: number | undefined;
  observedPromptTokens?: number | undefined;
  /** The steps it went on without, by kind and reason in the order first skipped; empty when complete. */
  skippedCounts: SkippedCount[];
}

/** How often the prefix broke for one history key, which parts broke it, and the cost. */
export interface CacheHistory {
  /** `scope "agent-1"` or `key "conv-7"`. */
  key: string;
  reports: number;
  breaks: number;
  /** [part, breaks], most first. */
  breakers: [string, number][];
  /** In total. */
  recomputed: Size;
  /** Oldest first. */
  recent: CacheHistoryEntry[];
  /** Its earlier history was evicted to make room for other keys. */
  evicted: boolean;
}
