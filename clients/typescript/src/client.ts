/** connect(), the client, scope handles and disposers. */

import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { Interceptor } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { entryFromProto, historyFromProto, usageFrom } from "./cacheHistory.js";
import { ChangeStream, WATCH_FEATURES } from "./changes.js";
import { answerError, CALL_TIMEOUT_MS, Connection, notReady, type Registration } from "./connection.js";
import { assemblyFromProto, contextToProto, layoutToProto, reportFromProto, toolsToProto } from "./convert.js";
import { invalid, NoAnswer } from "./errors.js";
import { FEATURE_TOOL_SLOTS, label, ListenerStream, type Listener } from "./listeners.js";
import { PromptStream } from "./prompts.js";
import type { Provider } from "./providers.js";
import { openChannel, Rpc, type Method, type TlsOptions } from "./rpc.js";
import { changeFilter, listRegistrations, type FilterOptions } from "./snapshots.js";
import { updateFor, type UpdatableRequest } from "./updates.js";
import type {
  AssembleContext,
  CacheHistory,
  CacheHistoryEntry,
  JsonObject,
  PrefixLayout,
  PromptAssembly,
  RenderedPrompt,
  Snapshot,
  ToolProviderResult,
  ToolSchemaLike,
} from "./types.js";

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

/** A prompt section in the original API's object form. */
export interface PromptSection {
  name: string;
  order: number;
  text: TextSource;
  /** This section becomes the exact, complete prompt. */
  complete?: boolean | undefined;
}

/** A runtime context in the original API's object form. */
export interface PromptContext {
  name: string;
  order: number;
  text: TextSource;
}

/** Where a listener runs in the waterfall, and which assemblies it sees. */
export interface ListenerOptions {
  /** Run before the listeners registered earlier. */
  prepend?: boolean | undefined;
  /** Installed through a scope: see every assembly anyway. */
  global?: boolean | undefined;
}

/** What one assembly is for, and how to ask for it. */
export interface AssembleOptions {
  /** The scope key whose layers join the global one. */
  scope?: string | undefined;
  /** Free-form fields passed to every dynamic provider and listener (a JSON object). */
  fields?: JsonObject | undefined;
  /** Also report provenance, sizes and prefix stability (`assembly.report`). */
  report?: boolean | undefined;
  /** For a report: the history key to compare with and count under (default: the scope). */
  reportKey?: string | undefined;
  /** For a report: the order the model server caches in (default: the sidecar's). */
  prefixLayout?: PrefixLayout | undefined;
  /**
   * While the connection is down, wait up to this long for the reconnect instead
   * of failing fast with UNAVAILABLE; also the call's deadline.
   */
  timeoutMs?: number | undefined;
  /** Cancels the assembly (and its in-flight provider and listener calls). */
  signal?: AbortSignal | undefined;
}

/** What a change stream watches, and where it resumes from. */
export interface WatchOptions extends FilterOptions {
  /** Replay the changes after this revision first (the last one seen). */
  afterRevision?: number | undefined;
  /** The incarnation `afterRevision` belongs to; default: the current one. */
  incarnation?: string | undefined;
}

/** Options of {@link connect}. */
export interface ConnectOptions {
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string | undefined;
  /** TLS to the sidecar (`true`: the system's roots); mutual TLS with a client certificate. */
  tls?: TlsOptions | boolean | undefined;
  /**
   * Wait for the sidecar to come up instead of failing at once when it cannot be
   * reached: `true` waits up to `timeoutMs` (30 s without one), a number waits up
   * to that many milliseconds; then connecting fails UNAVAILABLE.
   */
  waitForReady?: boolean | number | undefined;
  /** Bounds connecting, waiting or not. */
  timeoutMs?: number | undefined;
  /**
   * Bounds what the sidecar answers at once (opening a session, a listener or a
   * change stream, a registration, a disposal); default 10 s. Past it the call
   * fails UNAVAILABLE (SIDECAR_UNAVAILABLE) and, for a registration or disposal,
   * the client opens a new session and replays.
   */
  callTimeoutMs?: number | undefined;
  /** A name for the sidecar's logs; default `node-<pid>`. */
  clientName?: string | undefined;
  /** grpc-js interceptors for every call and stream. */
  interceptors?: Interceptor[] | undefined;
}

/** `await off()` disposes one registration; calling it again does nothing. */
export interface Disposer {
  (): Promise<void>;
  /** True once it has run. */
  readonly disposed: boolean;
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
}

function disposer(dispose: () => Promise<void>): Disposer {
  let done = false;
  const off = async (): Promise<void> => {
    if (done) return;
    done = true;
    await dispose();
  };
  Object.defineProperty(off, "disposed", { get: () => done });
  return off as Disposer;
}

function handle(connection: Connection, registration: Registration, request: UpdatableRequest): Handle {
  const off = disposer(() => connection.dispose(registration)) as Disposer & Partial<Handle>;
  off.update = async (value, options) => {
    const update = updateFor(request, value);
    return connection.update(registration, update.request, update.apply, options?.timeoutMs);
  };
  return off as Handle;
}

/** The registration methods shared by the client (global layer) and scope handles. */
class Registrar {
  protected readonly connection: Connection;
  readonly #scope: Registration | undefined;

  protected constructor(connection: Connection, scope: Registration | undefined) {
    this.connection = connection;
    this.#scope = scope;
  }

  /** Contribute a prompt section; `text` is a string or a provider of one. */
  section(name: string, order: number, text: TextSource, options?: { complete?: boolean }): Promise<Handle>;
  /** Contribute a prompt section, in the original API's object form. */
  section(section: PromptSection): Promise<Handle>;
  section(
    first: string | PromptSection,
    order?: number,
    text?: TextSource,
    options?: { complete?: boolean },
  ): Promise<Handle> {
    const section = typeof first === "string" ? { name: first, order, text, ...options } : first;
    return this.#guard(() => {
      const request = create(pb.RegisterSectionRequestSchema, {
        name: section.name,
        order: checkOrder(section.order),
        complete: section.complete ?? false,
      });
      const key = this.#text(section.text, (source) => {
        request.textSource = source;
      });
      return this.#registerValue(pb.SystemPromptService.method.registerSection, request, key);
    });
  }

  /** Contribute an ordered runtime context; `text` is a string or a provider of one. */
  context(name: string, order: number, text: TextSource): Promise<Handle>;
  /** Contribute a runtime context, in the original API's object form. */
  context(context: PromptContext): Promise<Handle>;
  context(first: string | PromptContext, order?: number, text?: TextSource): Promise<Handle> {
    const context = typeof first === "string" ? { name: first, order, text } : first;
    return this.#guard(() => {
      const request = create(pb.RegisterContextRequestSchema, {
        name: context.name,
        order: checkOrder(context.order),
      });
      const key = this.#text(context.text, (source) => {
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

  /** Contribute tool schemas: a list, a ToolProviderResult, or a provider of either. */
  tools(provider: ToolsSource): Promise<Handle> {
    return this.#guard(() => {
      const request = create(pb.RegisterToolsRequestSchema);
      let key: string | undefined;
      if (typeof provider === "function") {
        key = this.connection.providers.add(provider as Provider);
        request.source = { case: "dynamic", value: create(pb.DynamicSchema, { providerKey: key }) };
        request.name = label(provider.name);
      } else {
        request.source = { case: "result", value: toolsToProto(provider) };
      }
      return this.#registerValue(pb.SystemPromptService.method.registerTools, request, key);
    });
  }

  /** Contribute {{name}}: a value, undefined (no value), or a provider of either. */
  variable(name: string, value: VariableSource): Promise<Handle> {
    return this.#guard(() => {
      const request = create(pb.RegisterVariableRequestSchema, { name });
      let key: string | undefined;
      if (typeof value === "function") {
        key = this.connection.providers.add(value as Provider);
        request.valueSource = { case: "dynamic", value: create(pb.DynamicSchema, { providerKey: key }) };
      } else if (value === undefined || value === null) {
        request.valueSource = { case: "noValue", value: create(pb.NoValueSchema) };
      } else if (typeof value === "string") {
        request.valueSource = { case: "value", value };
      } else {
        throw invalid(`value must be a string, undefined or a function, not ${typeof value}`);
      }
      return this.#registerValue(pb.SystemPromptService.method.registerVariable, request, key);
    });
  }

  /**
   * Install a waterfall listener: `(assembly, context, next) => assembly`.
   * See {@link Listener} for next() and tail calls.
   */
  async onAssemble(listener: Listener, options: ListenerOptions = {}): Promise<Disposer> {
    const start = create(pb.ListenStartSchema, {
      prepend: options.prepend ?? false,
      global: options.global ?? false,
      name: label(listener.name || "anonymous"),
      features: [FEATURE_TOOL_SLOTS], // this client decodes slot-encoded tools in next() results
    });
    const registration: Registration = {
      registrationId: "",
      scope: this.#scope,
      make: async (rpc, sessionId, scopeId, timeoutMs) => {
        start.sessionId = sessionId;
        start.scopeId = scopeId;
        const stream = new ListenerStream(rpc, listener, () => this.connection.restart());
        return { id: await stream.start(start, timeoutMs), stream };
      },
    };
    await this.connection.register(registration);
    return disposer(() => this.connection.dispose(registration));
  }

  async #guard(register: () => Promise<Handle>): Promise<Handle> {
    return register(); // an argument error surfaces as a rejected promise, like every other
  }

  #text(
    text: TextSource | undefined,
    set: (source: { case: "text"; value: string } | { case: "dynamic"; value: pb.Dynamic }) => void,
  ): string | undefined {
    if (typeof text === "function") {
      const key = this.connection.providers.add(text as Provider);
      set({ case: "dynamic", value: create(pb.DynamicSchema, { providerKey: key }) });
      return key;
    }
    if (typeof text !== "string") throw invalid(`text must be a string or a function, not ${typeof text}`);
    set({ case: "text", value: text });
    return undefined;
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
          const reply = await rpc.unary(method, request, new Date(Date.now() + timeoutMs));
          return { id: (reply as unknown as { registrationId: string }).registrationId };
        } catch (error) {
          throw answerError(error, method.name, timeoutMs);
        }
      },
    };
    await this.connection.register(registration);
    return registration;
  }
}

/** A handle on a scope key: registrations made through it land in that scope's layer. */
export class Scope extends Registrar {
  /** The scope key. */
  readonly key: string;
  /** The parent key this handle asked for, if any. */
  readonly parent: string | undefined;
  readonly #disposer: Disposer;

  /** @internal Use `client.scope(key, parent)`. */
  constructor(connection: Connection, key: string, parent: string | undefined, registration: Registration) {
    super(connection, registration);
    this.key = key;
    this.parent = parent;
    this.#disposer = disposer(() => connection.dispose(registration));
  }

  /** Close the handle and dispose everything registered through it. */
  dispose(): Promise<void> {
    return this.#disposer();
  }
}

/** A session with the sidecar; registrations made here are global. */
export class Client extends Registrar {
  /** @internal Use {@link connect}. */
  constructor(connection: Connection) {
    super(connection, undefined);
  }

  /** The current session's id (a new one after a reconnect). */
  get sessionId(): string {
    return this.connection.sessionId;
  }

  /** False while the connection is down and being re-established. */
  get connected(): boolean {
    return this.connection.connected;
  }

  /** Open a handle on scope `key`, binding its parent the first time one is given. */
  async scope(key: string, parent?: string): Promise<Scope> {
    const request = create(pb.OpenScopeRequestSchema, { key, parentKey: parent ?? "" });
    const registration: Registration = {
      registrationId: "",
      make: async (rpc, sessionId, _scopeId, timeoutMs) => {
        request.sessionId = sessionId;
        try {
          const deadline = new Date(Date.now() + timeoutMs);
          return { id: (await rpc.unary(pb.SystemPromptService.method.openScope, request, deadline)).scopeId };
        } catch (error) {
          throw answerError(error, "OpenScope", timeoutMs);
        }
      },
    };
    await this.connection.register(registration);
    return new Scope(this.connection, key, parent, registration);
  }

  /**
   * Assemble the prompt for `scope` with `fields` passed to providers and listeners.
   *
   * While the connection is down this fails fast with UNAVAILABLE, or, with a
   * `timeoutMs`, waits up to that long for the reconnect first. With `report`,
   * `assembly.report` tells provenance, sizes and prefix stability.
   */
  async assemble(options: AssembleOptions = {}): Promise<PromptAssembly> {
    return toAssembly(await this.#assemble(options, false));
  }

  /** Assemble and render on the sidecar (rejects with a RenderError like renderPrompt). */
  async render(options: AssembleOptions = {}): Promise<RenderedPrompt> {
    const reply = await this.#assemble(options, true);
    return {
      prompt: reply.rendered?.prompt ?? "",
      contextSnapshot: reply.rendered?.contextSnapshot ?? "",
      assembly: toAssembly(reply),
    };
  }

  /**
   * Subscribe to change events; subscribed when the promise resolves.
   *
   * `scope` keeps that scope's layer only (with `ancestors`, also its ancestors' and
   * the global layer); `kinds` keeps those kinds. With `afterRevision` (and the
   * `incarnation` it belongs to), the changes after it are replayed first, or a
   * ChangesResynced says they cannot be. The stream resumes by itself after a
   * restart or a dropped connection.
   */
  async watchChanges(options: WatchOptions = {}): Promise<ChangeStream> {
    await this.connection.ready();
    const request = create(pb.WatchChangesRequestSchema, {
      filter: changeFilter(options),
      incarnation: options.incarnation ?? "",
      features: WATCH_FEATURES,
    });
    if (options.afterRevision !== undefined) request.afterRevision = BigInt(options.afterRevision);
    const streams = this.connection.streams;
    const stream = await ChangeStream.open(this.connection.rpc, request, this.connection.callTimeoutMs, (closed) =>
      streams.delete(closed),
    );
    if (this.connection.closed) stream.close();
    else streams.add(stream);
    return stream;
  }

  /** The registrations now (filtered like `watchChanges`), with their values if asked. */
  async snapshot(options: FilterOptions & { values?: boolean | undefined } = {}): Promise<Snapshot> {
    await this.connection.ready();
    const request = create(pb.ListRegistrationsRequestSchema, {
      filter: changeFilter(options),
      includeValues: options.values ?? false,
    });
    return listRegistrations(this.connection.rpc, request, this.connection.callTimeoutMs);
  }

  /**
   * Watch the prompt of `scope` as its static parts make it, change by change. Each
   * PromptChange says what changed and whether it breaks the model server's prompt
   * cache (`report.stability`); dynamic parts are placeholders, never evaluated.
   */
  async watchPrompt(
    options: { scope?: string | undefined; render?: boolean | undefined; prefixLayout?: PrefixLayout | undefined } = {},
  ): Promise<PromptStream> {
    await this.connection.ready();
    const request = create(pb.WatchPromptRequestSchema, {
      scope: options.scope ?? "",
      render: options.render ?? false,
      prefixLayout: layoutToProto(options.prefixLayout),
    });
    const streams = this.connection.streams;
    const call = this.connection.rpc.serverStream(pb.SystemPromptService.method.watchPrompt, request);
    const stream = new PromptStream(call, (closed) => streams.delete(closed));
    streams.add(stream);
    return stream;
  }

  /** The prompt-cache history of `reportKey`, or of `scope` when no key is named. */
  async cacheHistory(options: { scope?: string | undefined; reportKey?: string | undefined } = {}): Promise<CacheHistory> {
    const request = create(pb.GetCacheHistoryRequestSchema, {
      scope: options.scope ?? "",
      reportKey: options.reportKey ?? "",
    });
    const reply = await this.connection.call(pb.SystemPromptService.method.getCacheHistory, request);
    return historyFromProto(reply.history);
  }

  /**
   * Tell the sidecar what the model server said about the last reported request.
   * `usage` is the response's usage object (DeepSeek, Anthropic or OpenAI); the
   * returned entry holds the predicted stable prefix and what was observed.
   */
  async reportUsage(
    usage: unknown,
    options: { scope?: string | undefined; reportKey?: string | undefined } = {},
  ): Promise<CacheHistoryEntry> {
    const read = usageFrom(usage);
    const request = create(pb.ReportUsageRequestSchema, {
      scope: options.scope ?? "",
      reportKey: options.reportKey ?? "",
      cachedTokens: BigInt(read.cachedTokens),
    });
    if (read.promptTokens !== undefined) request.promptTokens = BigInt(read.promptTokens);
    const reply = await this.connection.call(pb.SystemPromptService.method.reportUsage, request);
    return entryFromProto(reply.entry);
  }

  /** End the session; the sidecar disposes everything it registered. Idempotent. */
  close(): Promise<void> {
    return this.connection.close();
  }

  async #assemble(options: AssembleOptions, render: boolean): Promise<pb.AssembleResponse> {
    const request = create(pb.AssembleRequestSchema, {
      context: contextToProto(options.scope, options.fields),
      render,
      report: options.report ?? false,
      reportKey: options.reportKey ?? "",
      prefixLayout: layoutToProto(options.prefixLayout),
    });
    return this.connection.call(
      pb.SystemPromptService.method.assemble,
      request,
      options.timeoutMs,
      options.signal,
    );
  }
}

/** Where connect() goes without an address: `$DSP_ADDRESS`, else this. */
export const DEFAULT_ADDRESS = "127.0.0.1:50051";
/** waitForReady without a timeout still gives up, and says so. */
const READY_TIMEOUT_MS = 30_000;

/** `$DSP_ADDRESS` when set, else 127.0.0.1:50051. */
export function defaultAddress(): string {
  return process.env["DSP_ADDRESS"] || DEFAULT_ADDRESS;
}

/**
 * Open a session with the sidecar at `address` (HOST:PORT or unix:PATH; default
 * `$DSP_ADDRESS`, else 127.0.0.1:50051).
 *
 * `token` is sent as `authorization: Bearer <token>` on every call; `tls`
 * switches to TLS (mutual TLS when it carries a client certificate). Rejects
 * with UNAVAILABLE when the sidecar cannot be reached, unless `waitForReady`.
 */
export async function connect(address?: string, options: ConnectOptions = {}): Promise<Client> {
  const target = address || defaultAddress();
  const rpc = new Rpc(openChannel(target, options), options.token);
  const callTimeoutMs = options.callTimeoutMs ?? CALL_TIMEOUT_MS;
  const connection = new Connection(rpc, options.clientName ?? `node-${process.pid}`, callTimeoutMs);
  const { waitForReady: wait, timeoutMs } = options;
  try {
    if (wait === true || typeof wait === "number") {
      await connection.openWhenReady(target, wait === true ? (timeoutMs ?? READY_TIMEOUT_MS) : wait);
    } else {
      await connection.open(Math.min(callTimeoutMs, timeoutMs ?? Infinity));
    }
  } catch (error) {
    rpc.close();
    if (error instanceof NoAnswer && timeoutMs !== undefined && timeoutMs < callTimeoutMs) {
      throw notReady(target, timeoutMs);
    }
    throw error;
  }
  return new Client(connection);
}

function toAssembly(reply: pb.AssembleResponse): PromptAssembly {
  const assembly = assemblyFromProto(reply.assembly);
  if (reply.report !== undefined) assembly.report = reportFromProto(reply.report);
  return assembly;
}

function checkOrder(order: unknown): number {
  if (typeof order !== "number") throw invalid(`order must be a number, not ${typeof order}`);
  return order;
}
