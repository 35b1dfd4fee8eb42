/** connect(), the client and scope handles (registering itself is in registrar.ts). */

import { create } from "@bufbuild/protobuf";
import type { Interceptor } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { entryFromProto, historyFromProto, usageFrom } from "./cacheHistory.js";
import { ChangeStream, WATCH_FEATURES } from "./changes.js";
import { answerError, CALL_TIMEOUT_MS, Connection, notReady, type Registration } from "./connection.js";
import {
  assemblyFromProto,
  contextToProto,
  freezeToProto,
  layoutToProto,
  reportFromProto,
  skippedFromProto,
} from "./convert.js";
import { invalid, NoAnswer } from "./errors.js";
import { LOCAL_CACHE_BYTES, LocalCache } from "./localCache.js";
import { PromptStream } from "./prompts.js";
import { disposer, Registrar, type Disposer } from "./registrar.js";
import { openChannel, Rpc, type TlsOptions } from "./rpc.js";
import { changeFilter, listRegistrations, type FilterOptions } from "./snapshots.js";
import type {
  CacheHistory,
  CacheHistoryEntry,
  JsonObject,
  PrefixLayout,
  PromptAssembly,
  RenderedPrompt,
  Snapshot,
  ToolFreeze,
} from "./types.js";

export type {
  CallbackOptions,
  Disposer,
  Handle,
  ListenerHandle,
  ListenerOptions,
  PromptContext,
  PromptSection,
  SectionOptions,
  TextSource,
  ToolsSource,
  VariableSource,
} from "./registrar.js";

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
   * For a report: hold or release the report key's tool list (a frozen key's reported
   * assembly whose tools differ rejects FAILED_PRECONDITION / TOOLS_FROZEN).
   */
  toolFreeze?: ToolFreeze | undefined;
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
  /**
   * Answer `assemble()` (without a report) of a scope whose plan is all-static from
   * a copy kept in this client, checked against its own change stream (see
   * docs/protocol.md, "The local cache"). Default false.
   */
  localCache?: boolean | undefined;
  /**
   * What the local cache keeps, at most: its answers' texts, in bytes (two a UTF-16
   * unit); the least recently used go first. Default 32 MiB.
   */
  localCacheBytes?: number | undefined;
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
          const reply = await rpc.unary(pb.SystemPromptService.method.openScope, request, deadline);
          return { id: reply.scopeId, revision: Number(reply.revision) };
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
    const local = this.connection.local;
    // a freeze without a report is the sidecar's to refuse, never a kept answer
    if (local !== undefined && !options.report && options.toolFreeze === undefined) {
      return this.#assembleLocally(local, options);
    }
    return toAssembly(await this.#assemble(options, false));
  }

  /** The kept answer while it is the registry's; else asked for, and kept if it may be. */
  async #assembleLocally(local: LocalCache, options: AssembleOptions): Promise<PromptAssembly> {
    const key = options.scope ?? "";
    const context = contextToProto(options.scope, options.fields); // its fieldsJson keys a rules-only answer
    const kept = this.connection.connected ? local.get(key, context.fieldsJson) : undefined;
    if (kept !== undefined) return kept;
    const ticket = local.ticket(key);
    const reply = await this.#assemble(options, false, context);
    local.put(ticket, key, context.fieldsJson, reply);
    return toAssembly(reply);
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

  async #assemble(
    options: AssembleOptions,
    render: boolean,
    context = contextToProto(options.scope, options.fields),
  ): Promise<pb.AssembleResponse> {
    const request = create(pb.AssembleRequestSchema, {
      context,
      render,
      report: options.report ?? false,
      reportKey: options.reportKey ?? "",
      prefixLayout: layoutToProto(options.prefixLayout),
      toolFreeze: freezeToProto(options.toolFreeze),
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
  const maxBytes: unknown = options.localCacheBytes ?? LOCAL_CACHE_BYTES;
  if (typeof maxBytes !== "number" || !Number.isSafeInteger(maxBytes) || maxBytes < 1) {
    throw invalid(`localCacheBytes must be a whole number of at least 1, not ${String(maxBytes)}`);
  }
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
  if (options.localCache) await keepLocally(connection, maxBytes);
  return new Client(connection);
}

/** Give `connection` its local cache, subscribed to the changes it may watch. */
async function keepLocally(connection: Connection, maxBytes: number): Promise<void> {
  try {
    connection.local = await LocalCache.open(connection.rpc, connection.callTimeoutMs, maxBytes);
  } catch (error) {
    await connection.close();
    throw error;
  }
}

function toAssembly(reply: pb.AssembleResponse): PromptAssembly {
  const assembly = assemblyFromProto(reply.assembly);
  if (reply.report !== undefined) assembly.report = reportFromProto(reply.report);
  if (reply.skipped.length > 0) assembly.skipped = skippedFromProto(reply.skipped);
  return assembly;
}
