/** connect(), the client, scope handles and disposers. */

import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { Interceptor, ServiceError } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { ChangeStream } from "./changes.js";
import { Connection, type Provider, type Registration } from "./connection.js";
import { assemblyFromProto, contextToProto, reportFromProto, toolsToProto } from "./convert.js";
import { errorFromGrpc, invalid } from "./errors.js";
import { FEATURE_TOOL_SLOTS, label, ListenerStream, type Listener } from "./listeners.js";
import { openChannel, Rpc, type Method, type TlsOptions } from "./rpc.js";
import type {
  AssembleContext,
  JsonObject,
  PromptAssembly,
  RenderedPrompt,
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
  /**
   * While the connection is down, wait up to this long for the reconnect instead
   * of failing fast with UNAVAILABLE; also the call's deadline.
   */
  timeoutMs?: number | undefined;
  /** Cancels the assembly (and its in-flight provider and listener calls). */
  signal?: AbortSignal | undefined;
}

/** Options of {@link connect}. */
export interface ConnectOptions {
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string | undefined;
  /** TLS to the sidecar (`true`: the system's roots); mutual TLS with a client certificate. */
  tls?: TlsOptions | boolean | undefined;
  /**
   * Wait for the sidecar to come up instead of failing at once when it cannot be
   * reached: `true` waits without limit, a number waits up to that many milliseconds.
   */
  waitForReady?: boolean | number | undefined;
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

/** The registration methods shared by the client (global layer) and scope handles. */
class Registrar {
  protected readonly connection: Connection;
  readonly #scope: Registration | undefined;

  protected constructor(connection: Connection, scope: Registration | undefined) {
    this.connection = connection;
    this.#scope = scope;
  }

  /** Contribute a prompt section; `text` is a string or a provider of one. */
  section(name: string, order: number, text: TextSource, options?: { complete?: boolean }): Promise<Disposer>;
  /** Contribute a prompt section, in the original API's object form. */
  section(section: PromptSection): Promise<Disposer>;
  section(
    first: string | PromptSection,
    order?: number,
    text?: TextSource,
    options?: { complete?: boolean },
  ): Promise<Disposer> {
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
      return this.#register(pb.SystemPromptService.method.registerSection, request, key);
    });
  }

  /** Contribute an ordered runtime context; `text` is a string or a provider of one. */
  context(name: string, order: number, text: TextSource): Promise<Disposer>;
  /** Contribute a runtime context, in the original API's object form. */
  context(context: PromptContext): Promise<Disposer>;
  context(first: string | PromptContext, order?: number, text?: TextSource): Promise<Disposer> {
    const context = typeof first === "string" ? { name: first, order, text } : first;
    return this.#guard(() => {
      const request = create(pb.RegisterContextRequestSchema, {
        name: context.name,
        order: checkOrder(context.order),
      });
      const key = this.#text(context.text, (source) => {
        request.textSource = source;
      });
      return this.#register(pb.SystemPromptService.method.registerContext, request, key);
    });
  }

  /** Suppress runtime context here until the returned disposer runs. */
  suppressRuntimeContext(): Promise<Disposer> {
    const request = create(pb.SuppressRuntimeContextRequestSchema);
    return this.#register(pb.SystemPromptService.method.suppressRuntimeContext, request);
  }

  /** Contribute tool schemas: a list, a ToolProviderResult, or a provider of either. */
  tools(provider: ToolsSource): Promise<Disposer> {
    return this.#guard(() => {
      const request = create(pb.RegisterToolsRequestSchema);
      let key: string | undefined;
      if (typeof provider === "function") {
        key = this.connection.addProvider(provider as Provider);
        request.source = { case: "dynamic", value: create(pb.DynamicSchema, { providerKey: key }) };
        request.name = label(provider.name);
      } else {
        request.source = { case: "result", value: toolsToProto(provider) };
      }
      return this.#register(pb.SystemPromptService.method.registerTools, request, key);
    });
  }

  /** Contribute {{name}}: a value, undefined (no value), or a provider of either. */
  variable(name: string, value: VariableSource): Promise<Disposer> {
    return this.#guard(() => {
      const request = create(pb.RegisterVariableRequestSchema, { name });
      let key: string | undefined;
      if (typeof value === "function") {
        key = this.connection.addProvider(value as Provider);
        request.valueSource = { case: "dynamic", value: create(pb.DynamicSchema, { providerKey: key }) };
      } else if (value === undefined || value === null) {
        request.valueSource = { case: "noValue", value: create(pb.NoValueSchema) };
      } else if (typeof value === "string") {
        request.valueSource = { case: "value", value };
      } else {
        throw invalid(`value must be a string, undefined or a function, not ${typeof value}`);
      }
      return this.#register(pb.SystemPromptService.method.registerVariable, request, key);
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
      make: async (rpc, sessionId, scopeId) => {
        start.sessionId = sessionId;
        start.scopeId = scopeId;
        const stream = new ListenerStream(rpc, listener);
        return { id: await stream.start(start), stream };
      },
    };
    await this.connection.register(registration);
    return disposer(() => this.connection.dispose(registration));
  }

  async #guard(register: () => Promise<Disposer>): Promise<Disposer> {
    return register(); // an argument error surfaces as a rejected promise, like every other
  }

  #text(
    text: TextSource | undefined,
    set: (source: { case: "text"; value: string } | { case: "dynamic"; value: pb.Dynamic }) => void,
  ): string | undefined {
    if (typeof text === "function") {
      const key = this.connection.addProvider(text as Provider);
      set({ case: "dynamic", value: create(pb.DynamicSchema, { providerKey: key }) });
      return key;
    }
    if (typeof text !== "string") throw invalid(`text must be a string or a function, not ${typeof text}`);
    set({ case: "text", value: text });
    return undefined;
  }

  async #register<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageShape<I> & { sessionId: string; scopeId: string },
    providerKey?: string,
  ): Promise<Disposer> {
    const registration: Registration = {
      registrationId: "",
      scope: this.#scope,
      providerKey,
      make: async (rpc, sessionId, scopeId) => {
        request.sessionId = sessionId;
        request.scopeId = scopeId;
        try {
          const reply = (await rpc.unary(method, request)) as unknown as { registrationId: string };
          return { id: reply.registrationId };
        } catch (error) {
          throw errorFromGrpc(error as ServiceError);
        }
      },
    };
    await this.connection.register(registration);
    return disposer(() => this.connection.dispose(registration));
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
      make: async (rpc, sessionId) => {
        request.sessionId = sessionId;
        try {
          return { id: (await rpc.unary(pb.SystemPromptService.method.openScope, request)).scopeId };
        } catch (error) {
          throw errorFromGrpc(error as ServiceError);
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

  /** Subscribe to change events; subscribed when the promise resolves. */
  async watchChanges(): Promise<ChangeStream> {
    await this.connection.ready();
    const call = this.connection.rpc.serverStream(
      pb.SystemPromptService.method.watchChanges,
      create(pb.WatchChangesRequestSchema),
    );
    return ChangeStream.open(call);
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
    });
    return this.connection.call(
      pb.SystemPromptService.method.assemble,
      request,
      options.timeoutMs,
      options.signal,
    );
  }
}

/**
 * Open a session with the sidecar at `address` (HOST:PORT or unix:PATH).
 *
 * `token` is sent as `authorization: Bearer <token>` on every call; `tls`
 * switches to TLS (mutual TLS when it carries a client certificate). Rejects
 * with UNAVAILABLE when the sidecar cannot be reached, unless `waitForReady`.
 */
export async function connect(address: string, options: ConnectOptions = {}): Promise<Client> {
  const rpc = new Rpc(openChannel(address, options), options.token);
  const connection = new Connection(rpc, options.clientName ?? `node-${process.pid}`);
  const wait = options.waitForReady;
  try {
    await connection.open(wait === true ? Infinity : wait === false ? undefined : wait);
  } catch (error) {
    rpc.close();
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
