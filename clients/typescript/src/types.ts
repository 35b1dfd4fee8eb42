/** The client's value types: plain data, shaped like the registry's original TypeScript API. */

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

/** Where an assembled part came from. */
export interface Source {
  kind: "builtin" | "global" | "scope" | "listener";
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

/** One rendered part, in model order: its origin, size, fingerprint and stability. */
export interface PartReport {
  kind: "tool" | "section" | "context";
  name: string;
  source: Source;
  bytes: number;
  tokens?: number | undefined;
  fingerprint: string;
  stable: boolean;
}

/** How much of the prefix (tools, then system prompt) is unchanged since last time. */
export interface PrefixStability {
  hasPrevious: boolean;
  stableBytes: number;
  stableTokens?: number | undefined;
  prefix: Size;
  /** E.g. `section "cwd"`; "" when nothing changed. */
  firstChanged: string;
  /** E.g. `section "cwd" text changed (variable {{cwd}} changed)`. */
  reason: string;
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
}

/** An assembly rendered by the sidecar. */
export interface RenderedPrompt {
  prompt: string;
  contextSnapshot: string;
  assembly: PromptAssembly;
}

/** What a change event is about. */
export type ChangeKind =
  | "section"
  | "context"
  | "tools"
  | "variable"
  | "suppressor"
  | "listener"
  | "scope";

/** One registration or disposal seen on the change stream. */
export interface ChangeEvent {
  type: "change";
  /** Grows by one with every change. */
  revision: number;
  kind: ChangeKind;
  action: "registered" | "unregistered";
  /** The section's, context's or variable's name, a scope's key, a provider's label. */
  name: string;
  /** The scope whose layer changed; undefined for the global layer. */
  scope?: string | undefined;
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
