/**
 * A scripted sidecar: a @grpc/grpc-js server in this process whose every answer a test writes.
 *
 * The real sidecar never misbehaves on purpose; this one does whatever the current
 * test's `Script` says: a wrong message, a stream cut mid-replay, an error without
 * a reason, silence. It counts the streams open on it, so a test can show the
 * client left none behind. The TypeScript twin of tests/scripted.py.
 *
 * A script is a subclass of `Script` that overrides the calls it cares about; the
 * defaults answer like a well-behaved sidecar. Streams are `Peer`s: what the client
 * sent, what to send it, and the call's end.
 */

import { create, fromBinary, toBinary, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { after, afterEach, before, beforeEach } from "node:test";
import { waitFor } from "./helpers.js";

/** The callTimeoutMs of the clients the tests connect. */
export const CALL_TIMEOUT_MS = 500;

/** How a stream or call ends: with OK, or with this error (and an ErrorInfo reason when given). */
export interface End {
  code: grpc.status;
  message?: string;
  reason?: string;
}

type ServerStream<Res> = grpc.ServerWritableStream<unknown, Res> | grpc.ServerDuplexStream<unknown, Res>;

/** One stream as the scripted sidecar sees it: the client's messages, and its end. */
export class Peer<Req, Res> {
  /** The client's first message, once a script took it. */
  start: Req | undefined;
  /** The server-streaming call's request. */
  readonly request: Req | undefined;
  /** Keep the stream open when the client half-closes (a silent sidecar). */
  holdOpen = false;
  readonly ended: Promise<void>;
  #isEnded = false;
  readonly #call: ServerStream<Res>;
  readonly #received: (Req | null)[] = [];
  #waiting: ((message: Req | null) => void) | undefined;

  constructor(call: ServerStream<Res>, request?: Req) {
    this.#call = call;
    this.request = request;
    this.ended = new Promise((resolve) => {
      const end = (): void => {
        this.#isEnded = true;
        resolve();
      };
      call.on("cancelled", end);
      call.on("finish", end);
      call.on("error", () => undefined);
    });
    if ("read" in call && request === undefined) {
      call.on("data", (message: Req) => this.#push(message));
      call.on("end", () => {
        this.#push(null);
        if (!this.holdOpen) this.end();
      });
    }
  }

  get isEnded(): boolean {
    return this.#isEnded;
  }

  /** Send `message` on the stream (ignored once it is over). */
  send(message: Res): void {
    if (!this.#isEnded) this.#call.write(message);
  }

  /** End the stream with OK or with `end`'s error. */
  end(end?: End): void {
    if (this.#isEnded) return;
    if (end === undefined || end.code === grpc.status.OK) this.#call.end();
    else this.#call.emit("error", failure(end));
  }

  /** The client's next message (null when it half-closed); rejects after `timeoutMs`. */
  take(timeoutMs = 5_000): Promise<Req | null> {
    const queued = this.#received.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiting = undefined;
        reject(new Error(`nothing from the client within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiting = (message) => {
        clearTimeout(timer);
        resolve(message);
      };
    });
  }

  /** The client's next message, which must come. */
  async next(timeoutMs = 5_000): Promise<Req> {
    const message = await this.take(timeoutMs);
    if (message === null) throw new Error("the client half-closed the stream");
    return message;
  }

  #push(message: Req | null): void {
    const waiting = this.#waiting;
    this.#waiting = undefined;
    if (waiting !== undefined) waiting(message);
    else this.#received.push(message);
  }
}

export type SessionPeer = Peer<pb.OpenSessionRequest, pb.OpenSessionResponse>;
export type ListenerPeer = Peer<pb.ListenRequest, pb.ListenResponse>;
export type WatchPeer = Peer<pb.WatchChangesRequest, pb.WatchChangesResponse>;
export type ListingPeer = Peer<pb.ListRegistrationsRequest, pb.ListRegistrationsResponse>;

/** A unary call's error, with an ErrorInfo reason in grpc-status-details-bin when given. */
export function failure(end: End): Partial<grpc.StatusObject> {
  const metadata = new grpc.Metadata();
  if (end.reason !== undefined) metadata.set("grpc-status-details-bin", statusDetails(end));
  return { code: end.code, details: end.message ?? "", metadata };
}

// google.rpc.Status {1: code, 2: message, 3: Any {1: type_url, 2: ErrorInfo {1: reason, 2: domain}}}
function statusDetails(end: End): Buffer {
  const info = new BinaryWriter()
    .tag(1, WireType.LengthDelimited)
    .string(end.reason ?? "")
    .tag(2, WireType.LengthDelimited)
    .string("dsh.systemprompt.v1")
    .finish();
  const any = new BinaryWriter()
    .tag(1, WireType.LengthDelimited)
    .string("type.googleapis.com/google.rpc.ErrorInfo")
    .tag(2, WireType.LengthDelimited)
    .bytes(info)
    .finish();
  const status = new BinaryWriter()
    .tag(1, WireType.Varint)
    .int32(end.code)
    .tag(2, WireType.LengthDelimited)
    .string(end.message ?? "")
    .tag(3, WireType.LengthDelimited)
    .bytes(any)
    .finish();
  return Buffer.from(status);
}

/** `message` with a length-delimited field this proto does not have (a newer sidecar's). */
export function withUnknownField<T extends { $unknown?: { no: number; wireType: WireType; data: Uint8Array }[] }>(
  message: T,
  no = 999,
): T {
  const data = new BinaryWriter().bytes(new TextEncoder().encode("from the future")).finish();
  message.$unknown = [...(message.$unknown ?? []), { no, wireType: WireType.LengthDelimited, data }];
  return message;
}

/** What the scripted sidecar does; the defaults are a well-behaved sidecar's. */
export class Script {
  sessionFeatures: string[] = [];
  listenerFeatures: string[] = ["tool-slots"];
  #ids = 0;
  readonly sessions: SessionPeer[] = [];
  readonly listeners: ListenerPeer[] = [];
  readonly watchers: WatchPeer[] = [];
  /** (method, request) of every unary call. */
  readonly unary: [string, { sessionId?: string; name?: string; render?: boolean }][] = [];

  newId(prefix: string): string {
    this.#ids += 1;
    return `${prefix}${this.#ids}`;
  }

  async openSession(peer: SessionPeer): Promise<void> {
    peer.start = await peer.next();
    peer.send(opened(this.newId("session-"), { features: this.sessionFeatures }));
  }

  async listen(peer: ListenerPeer): Promise<void> {
    peer.start = await peer.next();
    peer.send(registered(this.newId("listener-"), { features: this.listenerFeatures }));
  }

  async watch(peer: WatchPeer): Promise<void> {
    peer.send(create(pb.WatchChangesResponseSchema, { kind: { case: "subscribed", value: { revision: 10n } } }));
  }

  /** A listing: nothing registered, at revision 10. */
  async listRegistrations(peer: ListingPeer): Promise<void> {
    peer.send(create(pb.ListRegistrationsResponseSchema, { revision: 10n }));
    peer.end();
  }

  /** A unary call's answer: a registration id, a scope id, or an empty reply; throw an End to fail it. */
  async answer(method: string, _request: unknown, _call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
    const reply: Record<string, unknown> = {};
    if (method.startsWith("Register") || method === "SuppressRuntimeContext") reply["registrationId"] = this.newId("registration-");
    if (method === "OpenScope") reply["scopeId"] = this.newId("scope-");
    return reply;
  }
}

/** Never answers: resolves when the call is cancelled by the client. */
export function silence(call: { on(event: "cancelled", listener: () => void): unknown }): Promise<never> {
  return new Promise((_resolve, reject) => call.on("cancelled", () => reject(failure({ code: grpc.status.CANCELLED }))));
}

export function opened(sessionId: string, fields: { features?: string[]; sidecarVersion?: string } = {}): pb.OpenSessionResponse {
  return create(pb.OpenSessionResponseSchema, {
    kind: { case: "opened", value: create(pb.SessionOpenedSchema, { sessionId, ...fields }) },
  });
}

export function registered(registrationId: string, fields: { features?: string[] } = {}): pb.ListenResponse {
  return create(pb.ListenResponseSchema, {
    kind: { case: "registered", value: create(pb.ListenerRegisteredSchema, { registrationId, ...fields }) },
  });
}

export function provide(callId: number, key: string, fieldsJson = "", kind = pb.ProviderKind.SECTION): pb.OpenSessionResponse {
  return create(pb.OpenSessionResponseSchema, {
    kind: {
      case: "provide",
      value: { callId: BigInt(callId), calls: [{ providerKey: key, kind }], context: { fieldsJson } },
    },
  });
}

export function wireTool(name: string): MessageInitShape<typeof pb.ToolSchemaSchema> {
  return { name, description: `the ${name} tool`, parametersJson: "{}" };
}

export function invocation(id: number, ...tools: MessageInitShape<typeof pb.ToolSchemaSchema>[]): pb.ListenResponse {
  return create(pb.ListenResponseSchema, {
    kind: { case: "invocation", value: { invocationId: BigInt(id), assembly: { tools } } },
  });
}

export function nextResult(
  id: number,
  slots: number[],
  ...tools: MessageInitShape<typeof pb.ToolSchemaSchema>[]
): pb.ListenResponse {
  return create(pb.ListenResponseSchema, {
    kind: { case: "nextResult", value: { invocationId: BigInt(id), assembly: { tools }, toolSlots: slots } },
  });
}

export function change(revision: number): pb.WatchChangesResponse {
  return create(pb.WatchChangesResponseSchema, {
    kind: {
      case: "event",
      value: {
        revision: BigInt(revision),
        kind: pb.ChangeKind.SECTION,
        action: pb.ChangeAction.REGISTERED,
        name: `s${revision}`,
      },
    },
  });
}

export function missed(first: number, count: number, resync: number): pb.WatchChangesResponse {
  return create(pb.WatchChangesResponseSchema, {
    kind: {
      case: "missed",
      value: { firstMissedRevision: BigInt(first), count: BigInt(count), resyncRevision: BigInt(resync) },
    },
  });
}

/** The scripted sidecar: a grpc-js server on a free loopback port; `script` is replaced by every test. */
export class ScriptedSidecar {
  script = new Script();
  readonly address: string;
  readonly #server: grpc.Server;
  #open = 0;

  private constructor(server: grpc.Server, address: string) {
    this.#server = server;
    this.address = address;
  }

  static async start(): Promise<ScriptedSidecar> {
    const server = new grpc.Server();
    let sidecar: ScriptedSidecar | undefined;
    const self = (): ScriptedSidecar => {
      if (sidecar === undefined) throw new Error("not started");
      return sidecar;
    };
    const definition: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
    const handlers: grpc.UntypedServiceImplementation = {};
    for (const method of pb.SystemPromptService.methods) {
      const streamsIn = method.methodKind === "bidi_streaming" || method.methodKind === "client_streaming";
      const streamsOut = method.methodKind === "bidi_streaming" || method.methodKind === "server_streaming";
      definition[method.name] = {
        path: `/${pb.SystemPromptService.typeName}/${method.name}`,
        requestStream: streamsIn,
        responseStream: streamsOut,
        requestSerialize: serializer(method.input) as (message: unknown) => Buffer,
        requestDeserialize: deserializer(method.input),
        responseSerialize: serializer(method.output) as (message: unknown) => Buffer,
        responseDeserialize: deserializer(method.output),
      };
      handlers[method.name] = streamsOut
        ? (call: ServerStream<unknown>) => self().#stream(method.name, call)
        : (call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) =>
            self().#unary(method.name, call, callback);
    }
    server.addService(definition, handlers);
    const port = await new Promise<number>((resolve, reject) =>
      server.bindAsync("127.0.0.1:0", grpc.ServerCredentials.createInsecure(), (error, bound) =>
        error ? reject(error) : resolve(bound),
      ),
    );
    sidecar = new ScriptedSidecar(server, `127.0.0.1:${port}`);
    return sidecar;
  }

  /** Streams open on it now. */
  get openStreams(): number {
    return this.#open;
  }

  /** Resolves once no stream is open on it (the client left none behind); fails after `timeoutMs`. */
  waitAllClosed(timeoutMs = 5_000): Promise<void> {
    return waitFor(() => this.#open === 0, `every stream closed (${this.#open} open)`, timeoutMs);
  }

  stop(): Promise<void> {
    this.#server.forceShutdown();
    return Promise.resolve();
  }

  #stream(method: string, call: ServerStream<unknown>): void {
    this.#open += 1;
    const script = this.script;
    const request = "request" in call ? call.request : undefined;
    const peer = new Peer<never, never>(call as ServerStream<never>, request as never);
    void peer.ended.then(() => {
      this.#open -= 1;
    });
    const run = (): Promise<void> => {
      if (method === "OpenSession") {
        script.sessions.push(peer as unknown as SessionPeer);
        return script.openSession(peer as unknown as SessionPeer);
      }
      if (method === "Listen") {
        script.listeners.push(peer as unknown as ListenerPeer);
        return script.listen(peer as unknown as ListenerPeer);
      }
      if (method === "WatchChanges") {
        script.watchers.push(peer as unknown as WatchPeer);
        return script.watch(peer as unknown as WatchPeer);
      }
      if (method === "ListRegistrations") {
        script.unary.push([method, request as { sessionId?: string }]);
        return script.listRegistrations(peer as unknown as ListingPeer);
      }
      peer.end({ code: grpc.status.UNIMPLEMENTED, message: `the scripted sidecar does not serve ${method}` });
      return Promise.resolve();
    };
    run().catch(() => peer.end({ code: grpc.status.INTERNAL, message: "the script failed" }));
  }

  #unary(method: string, call: grpc.ServerUnaryCall<unknown, unknown>, callback: grpc.sendUnaryData<unknown>): void {
    const script = this.script;
    script.unary.push([method, call.request as { sessionId?: string }]);
    const output = pb.SystemPromptService.methods.find((m) => m.name === method)?.output;
    script.answer(method, call.request, call).then(
      (reply) => callback(null, output === undefined ? reply : create(output, reply as never)),
      (error: Partial<grpc.StatusObject>) => callback(error),
    );
  }
}

function serializer<T extends DescMessage>(schema: T): (message: MessageShape<T>) => Buffer {
  return (message) => Buffer.from(toBinary(schema, message));
}

function deserializer<T extends DescMessage>(schema: T): (bytes: Buffer) => MessageShape<T> {
  return (bytes) => fromBinary(schema, bytes);
}

/** A client of the scripted sidecar, with the short call timeout. */
export function connectTo(sidecar: ScriptedSidecar): Promise<dsp.Client> {
  return dsp.connect(sidecar.address, { callTimeoutMs: CALL_TIMEOUT_MS });
}

/** The timers and handles alive now, by type (what a test compares before and after). */
export function activeResources(): Map<string, number> {
  const counts = new Map<string, number>();
  for (const type of process.getActiveResourcesInfo()) counts.set(type, (counts.get(type) ?? 0) + 1);
  return counts;
}

/** One scripted sidecar for a test file, and clients that are closed after each test. */
export interface ScriptedHarness {
  readonly sidecar: ScriptedSidecar;
  /** Use `script` for this test. */
  use<S extends Script>(script: S): S;
  /** A client of the scripted sidecar (closed after the test). */
  connect(): Promise<dsp.Client>;
}

/**
 * Start a scripted sidecar before the file's tests. After each test its clients are
 * closed and the test fails if a stream is left open on the sidecar, or a timer or
 * socket of the client is left alive in this process.
 */
export function useScripted(): ScriptedHarness {
  let sidecar: ScriptedSidecar | undefined;
  let baseline = new Map<string, number>();
  const clients: dsp.Client[] = [];
  before(async () => {
    sidecar = await ScriptedSidecar.start();
  });
  beforeEach(() => {
    if (sidecar !== undefined) sidecar.script = new Script();
    baseline = activeResources();
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((client) => client.close()));
    await sidecar?.waitAllClosed();
    await waitFor(() => leftBehind(baseline).length === 0, `no timer or handle left behind (${leftBehind(baseline).join(", ")})`, 5_000);
  });
  after(async () => {
    await sidecar?.stop();
  });
  return {
    get sidecar(): ScriptedSidecar {
      if (sidecar === undefined) throw new Error("the scripted sidecar is not started yet");
      return sidecar;
    },
    use<S extends Script>(script: S): S {
      this.sidecar.script = script;
      return script;
    },
    async connect(): Promise<dsp.Client> {
      const client = await connectTo(this.sidecar);
      clients.push(client);
      return client;
    },
  };
}

/** Resource types of which more are alive now than in `baseline`. */
function leftBehind(baseline: Map<string, number>): string[] {
  return [...activeResources()]
    .filter(([type, count]) => count > (baseline.get(type) ?? 0))
    .map(([type, count]) => `${count - (baseline.get(type) ?? 0)} ${type}`);
}
