/** The registration methods the client and scope handles share, their value types and disposers. */

import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { Cache, cachePolicyOf, FEATURE_CALLBACK_CACHE } from "./callbackCache.js";
import { answerError, Connection, type Registration } from "./connection.js";
import { toolsToProto } from "./convert.js";
import { invalid } from "./errors.js";
import { FEATURE_PART_SLOTS, FEATURE_TOOL_SLOTS, label, ListenerStream, type Listener } from "./listeners.js";
import type { Provider } from "./providers.js";
import type { Method } from "./rpc.js";
import { ruleSpec, type Rule, type RuleOptions } from "./rules.js";
import { updateFor, type UpdatableRequest } from "./updates.js";
import type { AssembleContext, FailurePolicy, ToolProviderResult, ToolSchemaLike } from "./types.js";

/** A section's or context's text: a string, or a provider of one evaluated at each assembly. */
export type TextSource = string | ((context: AssembleContext) => string | Promise<string>);

/** A variable's value: a string, undefined (no value), or a provider of either. */
export type VariableSource =
  | string
  | undefined
  | null
  | ((context: AssembleContext) => string | undefined | null | Promise<string | undefined | null>);

/** Tool schemas: a list, a ToolProviderResult, or a provider of either. */
export type ToolsSource =
  | ToolSchemaLike[]
  | ToolProviderResult
  | ((
      context: AssembleContext,
    ) => ToolProviderResult | ToolSchemaLike[] | Promise<ToolProviderResult | ToolSchemaLike[]>);

/** How a provider or listener is asked (for a static value: nothing). */
export interface CallbackOptions {
  /**
   * Seconds it may take to answer, instead of the sidecar's `provider_timeout_s`
   * (up to its `max_callback_timeout_s`): an honest slow callback says so instead
   * of being ejected (docs/protocol.md, "Ejected callbacks").
   */
  timeoutS?: number | undefined;
  /**
   * "ignore" (FailurePolicy.IGNORE): an assembly it fails (or that times out waiting
   * for it) goes on without its step and says so in `assembly.skipped`; only for a
   * callback that decorates the prompt, never one that filters it. Default "fail"
   * (docs/protocol.md, "Failure policy").
   */
  failurePolicy?: FailurePolicy | undefined;
  /**
   * What its answer (a listener's: its result, for its input) depends on, so that the
   * sidecar may reuse it instead of asking: `Cache.REVISION`, `Cache.FIELDS` or
   * `Cache.ttl(s)` (docs/protocol.md, "Cacheable callbacks"); `invalidate()` on the
   * handle drops what it keeps. Default: asked at every assembly.
   */
  cache?: Cache | undefined;
}

/** A prompt section in the original API's object form. */
export interface PromptSection extends CallbackOptions {
  name: string;
  order: number;
  text: TextSource;
  /** This section becomes the exact, complete prompt. */
  complete?: boolean | undefined;
}

/** A runtime context in the original API's object form. */
export interface PromptContext extends CallbackOptions {
  name: string;
  order: number;
  text: TextSource;
}

/** Where a listener runs in the waterfall, which assemblies it sees, and its own time. */
export interface ListenerOptions extends CallbackOptions {
  /** Run before the listeners registered earlier. */
  prepend?: boolean | undefined;
  /** Installed through a scope: see every assembly anyway. */
  global?: boolean | undefined;
}

/** `await off()` disposes one registration; calling it again does nothing. */
export interface Disposer {
  (): Promise<void>;
  /** True once it has run. */
  readonly disposed: boolean;
}

/**
 * A listener's handle: `await off()` removes it, like any disposer, and
 * `await off.invalidate()` drops the sidecar's cached results of a listener installed
 * with `cache`: assemblies that start once it resolves invoke the listener again.
 */
export interface ListenerHandle extends Disposer {
  /**
   * Resolves once the sidecar confirms, within the call timeout (else UNAVAILABLE /
   * SIDECAR_UNAVAILABLE); at once when nothing can be cached (no `cache`, a disposed
   * listener, a sidecar without the feature, the connection being re-established).
   */
  invalidate(): Promise<void>;
}

/**
 * A static registration's handle: `await off()` disposes it, like any disposer, and
 * `await off.update(value)` replaces its value in place.
 *
 * Only the value changes (a section's or context's text, a variable's value or
 * undefined, a tool list or ToolProviderResult); its name, order and owner stay.
 * Other clients' assemblies see the old value or the new one, never neither, and
 * watchers get one `updated` event. After a reconnect the latest value is what is
 * registered again.
 */
export interface Handle extends Disposer {
  /**
   * Replace the value; resolves to the registry's revision after the update.
   * Rejects like a registration would for a bad value; NOT_UPDATABLE for a
   * registration made with a provider; while the connection is down, fails fast
   * with UNAVAILABLE or waits up to `timeoutMs` for the reconnect.
   */
  update(value: unknown, options?: { timeoutMs?: number | undefined }): Promise<number>;
  /**
   * Drop the sidecar's cached answers of this registration's provider (one made with
   * `cache`): assemblies that start once it resolves ask it again. Resolves once the
   * sidecar confirms, within the call timeout; at once for a static value.
   */
  invalidate(): Promise<void>;
}

export function disposer(dispose: () => Promise<void>): Disposer {
  let done = false;
  const off = async (): Promise<void> => {
    if (done) return;
    done = true;
    await dispose();
  };
  Object.defineProperty(off, "disposed", { get: () => done });
  return off as Disposer;
}

export function handle(connection: Connection, registration: Registration, request: UpdatableRequest): Handle {
  const off = disposer(() => connection.dispose(registration)) as Disposer & Partial<Handle>;
  off.update = async (value, options) => {
    const update = updateFor(request, value);
    return connection.update(registration, update.request, update.apply, options?.timeoutMs);
  };
  off.invalidate = () => connection.invalidate(registration);
  return off as Handle;
}

/** A registration's reply: its id, and the registry's revision after it. */
interface Registered {
  registrationId: string;
  revision: bigint;
}

/** The registration methods shared by the client (global layer) and scope handles. */
export class Registrar {
  protected readonly connection: Connection;
  readonly #scope: Registration | undefined;

  protected constructor(connection: Connection, scope: Registration | undefined) {
    this.connection = connection;
    this.#scope = scope;
  }

  /** Contribute a prompt section; `text` is a string or a provider of one (its `timeoutS`: CallbackOptions). */
  section(name: string, order: number, text: TextSource, options?: SectionOptions): Promise<Handle>;
  /** Contribute a prompt section, in the original API's object form. */
  section(section: PromptSection): Promise<Handle>;
  section(
    first: string | PromptSection,
    order?: number,
    text?: TextSource,
    options?: SectionOptions,
  ): Promise<Handle> {
    const section = typeof first === "string" ? { name: first, order, text, ...options } : first;
    return this.#guard(() => {
      const request = create(pb.RegisterSectionRequestSchema, {
        name: section.name,
        order: checkOrder(section.order),
        complete: section.complete ?? false,
      });
      const key = this.#text(section.text, section, (source) => {
        request.textSource = source;
      });
      return this.#registerValue(pb.SystemPromptService.method.registerSection, request, key);
    });
  }

  /** Contribute an ordered runtime context; `text` is a string or a provider of one. */
  context(name: string, order: number, text: TextSource, options?: CallbackOptions): Promise<Handle>;
  /** Contribute a runtime context, in the original API's object form. */
  context(context: PromptContext): Promise<Handle>;
  context(
    first: string | PromptContext,
    order?: number,
    text?: TextSource,
    options?: CallbackOptions,
  ): Promise<Handle> {
    const context = typeof first === "string" ? { name: first, order, text, ...options } : first;
    return this.#guard(() => {
      const request = create(pb.RegisterContextRequestSchema, {
        name: context.name,
        order: checkOrder(context.order),
      });
      const key = this.#text(context.text, context, (source) => {
        request.textSource = source;
      });
      return this.#registerValue(pb.SystemPromptService.method.registerContext, request, key);
    });
  }

  /** Suppress runtime context here until the returned disposer runs. */
  async suppressRuntimeContext(): Promise<Disposer> {
    const request = create(pb.SuppressRuntimeContextRequestSchema);
    const registration = await this.#register(pb.SystemPromptService.method.suppressRuntimeContext, request);
    return disposer(() => this.connection.dispose(registration));
  }

  /**
   * Contribute tool schemas: a list, a ToolProviderResult, or a provider of either.
   * `name` labels it in errors, reports and traces (a provider's default: its function's name).
   */
  tools(provider: ToolsSource, options: CallbackOptions & { name?: string | undefined } = {}): Promise<Handle> {
    return this.#guard(() => {
      const request = create(pb.RegisterToolsRequestSchema);
      let key: string | undefined;
      if (typeof provider === "function") {
        const dynamic = this.#dynamic(provider as Provider, options);
        key = dynamic.providerKey;
        request.source = { case: "dynamic", value: dynamic };
        request.name = options.name ?? label(provider.name);
      } else {
        refuseStatic(options);
        request.source = { case: "result", value: toolsToProto(provider) };
        request.name = options.name ?? "";
      }
      return this.#registerValue(pb.SystemPromptService.method.registerTools, request, key);
    });
  }

  /** Contribute {{name}}: a value, undefined (no value), or a provider of either. */
  variable(name: string, value: VariableSource, options: CallbackOptions = {}): Promise<Handle> {
    return this.#guard(() => {
      const request = create(pb.RegisterVariableRequestSchema, { name });
      const method = pb.SystemPromptService.method.registerVariable;
      if (typeof value === "function") {
        const dynamic = this.#dynamic(value as Provider, options);
        request.valueSource = { case: "dynamic", value: dynamic };
        return this.#registerValue(method, request, dynamic.providerKey);
      }
      refuseStatic(options);
      if (value === undefined || value === null) {
        request.valueSource = { case: "noValue", value: create(pb.NoValueSchema) };
      } else if (typeof value === "string") {
        request.valueSource = { case: "value", value };
      } else {
        throw invalid(`value must be a string, undefined or a function, not ${typeof value}`);
      }
      return this.#registerValue(method, request);
    });
  }

  /**
   * Register a rule: a waterfall step the sidecar runs itself, in CEL, with no hop
   * (docs/protocol.md, "Rules"). The handle's `update(rule)` replaces what it does in place.
   */
  rule(name: string, rule: Rule, options: RuleOptions = {}): Promise<Handle> {
    return this.#guard(() => {
      const request = create(pb.RegisterRuleRequestSchema, {
        name,
        prepend: options.prepend ?? false,
        global: options.global ?? false,
        rule: ruleSpec(rule),
      });
      return this.#registerValue(pb.SystemPromptService.method.registerRule, request);
    });
  }

  /**
   * Install a waterfall listener: `(assembly, context, next) => assembly`.
   * See {@link Listener} for next() and tail calls.
   */
  async onAssemble(listener: Listener, options: ListenerOptions = {}): Promise<ListenerHandle> {
    const start = create(pb.ListenStartSchema, {
      prepend: options.prepend ?? false,
      global: options.global ?? false,
      name: label(listener.name || "anonymous"),
      // this client reads and sends slots, and sends cache invalidations
      features: [FEATURE_TOOL_SLOTS, FEATURE_PART_SLOTS, FEATURE_CALLBACK_CACHE],
      timeoutS: timeoutSeconds(options),
      failurePolicy: failurePolicyOf(options),
      cache: cachePolicyOf(options.cache),
    });
    const registration: Registration = {
      registrationId: "",
      scope: this.#scope,
      make: async (rpc, sessionId, scopeId, timeoutMs) => {
        start.sessionId = sessionId;
        start.scopeId = scopeId;
        const stream = new ListenerStream(
          rpc,
          listener,
          () => this.connection.lost(registration, sessionId),
          () => this.connection.ejected(registration, sessionId),
        );
        return { id: await stream.start(start, timeoutMs), stream };
      },
    };
    await this.connection.register(registration);
    const off = disposer(() => this.connection.dispose(registration)) as Disposer & Partial<ListenerHandle>;
    off.invalidate = () => this.connection.invalidate(registration);
    return off as ListenerHandle;
  }

  async #guard(register: () => Promise<Handle>): Promise<Handle> {
    return register(); // an argument error surfaces as a rejected promise, like every other
  }

  #text(
    text: TextSource | undefined,
    options: CallbackOptions,
    set: (source: { case: "text"; value: string } | { case: "dynamic"; value: pb.Dynamic }) => void,
  ): string | undefined {
    if (typeof text === "function") {
      const dynamic = this.#dynamic(text as Provider, options);
      set({ case: "dynamic", value: dynamic });
      return dynamic.providerKey;
    }
    refuseStatic(options);
    if (typeof text !== "string") throw invalid(`text must be a string or a function, not ${typeof text}`);
    set({ case: "text", value: text });
    return undefined;
  }

  /** A provider kept here, as the sidecar is told of it; a bad option is refused before it is kept. */
  #dynamic(provider: Provider, options: CallbackOptions): pb.Dynamic {
    const timeoutS = timeoutSeconds(options);
    const failurePolicy = failurePolicyOf(options);
    const cache = cachePolicyOf(options.cache);
    const providerKey = this.connection.providers.add(provider);
    return create(pb.DynamicSchema, { providerKey, timeoutS, failurePolicy, cache });
  }

  async #registerValue<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageShape<I> & UpdatableRequest,
    providerKey?: string,
  ): Promise<Handle> {
    return handle(this.connection, await this.#register(method, request, providerKey), request);
  }

  async #register<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageShape<I> & { sessionId: string; scopeId: string },
    providerKey?: string,
  ): Promise<Registration> {
    const registration: Registration = {
      registrationId: "",
      scope: this.#scope,
      providerKey,
      make: async (rpc, sessionId, scopeId, timeoutMs) => {
        request.sessionId = sessionId;
        request.scopeId = scopeId;
        try {
          const reply = (await rpc.unary(method, request, new Date(Date.now() + timeoutMs))) as unknown as Registered;
          return { id: reply.registrationId, revision: Number(reply.revision) };
        } catch (error) {
          throw answerError(error, method.name, timeoutMs);
        }
      },
    };
    await this.connection.register(registration);
    return registration;
  }
}

/** A section's options: `complete`, and for a provider its own time. */
export interface SectionOptions extends CallbackOptions {
  /** This section becomes the exact, complete prompt. */
  complete?: boolean | undefined;
}

/** A callback's own time as sent: 0 (the sidecar's provider_timeout_s) when not given. */
function timeoutSeconds(options: CallbackOptions): number {
  const timeoutS: unknown = options.timeoutS;
  if (timeoutS === undefined) return 0;
  if (typeof timeoutS !== "number" || !Number.isFinite(timeoutS) || timeoutS <= 0) {
    throw invalid(`timeoutS must be a positive number of seconds, not ${String(timeoutS)}`);
  }
  return timeoutS;
}

export const FAILURE_POLICIES: Record<FailurePolicy, pb.FailurePolicy> = {
  fail: pb.FailurePolicy.FAIL,
  ignore: pb.FailurePolicy.IGNORE,
};

/** A callback's failure policy as sent: unspecified (the sidecar's "fail") when not given. */
function failurePolicyOf(options: CallbackOptions): pb.FailurePolicy {
  const policy: unknown = options.failurePolicy;
  if (policy === undefined) return pb.FailurePolicy.UNSPECIFIED;
  if (policy !== "fail" && policy !== "ignore") {
    throw invalid(`failurePolicy must be "fail" or "ignore", not ${String(policy)}`);
  }
  return FAILURE_POLICIES[policy];
}

/** timeoutS, failurePolicy and cache are for providers: a static value is never asked for. */
function refuseStatic(options: CallbackOptions): void {
  for (const option of ["timeoutS", "failurePolicy", "cache"] as const) {
    if (options[option] !== undefined) {
      throw invalid(`${option} applies to a provider (a function), not to a static value`);
    }
  }
}

export function checkOrder(order: unknown): number {
  if (typeof order !== "number") throw invalid(`order must be a number, not ${typeof order}`);
  return order;
}
