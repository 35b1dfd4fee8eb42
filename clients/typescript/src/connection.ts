/**
 * The connection: channel, current session, dynamic providers, and replay after a restart.
 *
 * Every registration is kept as a `Registration` (what makes it). When the
 * session ends without the client closing it (the sidecar restarted, the network
 * dropped), the connection opens a new session with backoff and makes every
 * registration again in the original order, so assemblies after the restart
 * equal those before it. Disposers point at registrations, so they keep working
 * across restarts.
 */

import { setTimeout as sleep } from "node:timers/promises";
import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { ClientDuplexStream, StatusObject } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { contextFromProto, toolsToProto } from "./convert.js";
import { Code, Reason, SystemPromptError, errorFromGrpc } from "./errors.js";
import { Deferred, describe, ListenerStream } from "./listeners.js";
import type { Method, Rpc } from "./rpc.js";
import type { AssembleContext } from "./types.js";

/** A dynamic provider, evaluated in this process at every assembly that needs it. */
export type Provider = (context: AssembleContext) => unknown;

/** One registration this client owns, and how to make it (again) for a session. */
export interface Registration {
  /** Makes the registration for `sessionId` (in `scopeId`'s layer); resolves to its id. */
  make(rpc: Rpc, sessionId: string, scopeId: string): Promise<{ id: string; stream?: ListenerStream }>;
  /** The scope handle it was made through. */
  scope?: Registration | undefined;
  providerKey?: string | undefined;
  registrationId: string;
  stream?: ListenerStream | undefined;
}

type SessionStream = ClientDuplexStream<pb.OpenSessionRequest, pb.OpenSessionResponse>;

const MAX_BACKOFF_MS = 2_000;
/** Sent in SessionStart, for the sidecar's logs only. */
const CLIENT_VERSION = "dsh-system-prompt-typescript/0.1.0";
const CLOSE_GRACE_MS = 5_000;

/** Owns the channel and the session stream; answers provider requests. */
export class Connection {
  readonly rpc: Rpc;
  readonly clientName: string;
  sessionId = "";
  closed = false;
  connected = false;
  /** Registrations in the order they were made (a Set keeps insertion order). */
  readonly registrations = new Set<Registration>();
  readonly #providers = new Map<string, Provider>();
  #keys = 0;
  #stream: SessionStream | undefined;
  #ended: Promise<void> = Promise.resolve();
  #reconnecting = false;
  #up = new Deferred<void>();
  readonly #closing = new AbortController();
  readonly #answering = new Map<bigint, AbortController>();

  constructor(rpc: Rpc, clientName: string) {
    this.rpc = rpc;
    this.clientName = clientName;
  }

  // -- session lifecycle ------------------------------------------------------------

  /** Open the first session; with `waitMs`, wait up to that long for the sidecar. */
  async open(waitMs?: number): Promise<void> {
    const deadline = waitMs === undefined ? undefined : Date.now() + waitMs;
    for (;;) {
      try {
        await this.#openSession();
        break;
      } catch (error) {
        const unavailable = error instanceof SystemPromptError && error.code === Code.UNAVAILABLE;
        if (deadline === undefined || !unavailable || Date.now() >= deadline) throw error;
        await this.rpc.waitForReady(new Date(deadline)).catch(() => undefined);
      }
    }
    this.#setConnected();
  }

  /** End the session: the sidecar disposes everything it registered. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.connected = false;
    this.#closing.abort();
    for (const registration of this.registrations) registration.stream?.close();
    for (const controller of this.#answering.values()) controller.abort();
    if (this.#stream !== undefined) {
      this.#stream.end(); // half-close: the clean end of a session
      await Promise.race([this.#ended, sleep(CLOSE_GRACE_MS, undefined, { ref: false })]);
    }
    this.rpc.close();
  }

  #openSession(): Promise<void> {
    const stream: SessionStream = this.rpc.bidi(pb.SystemPromptService.method.openSession);
    const ended = new Deferred<void>();
    return new Promise((resolve, reject) => {
      let opened = false;
      stream.on("data", (message: pb.OpenSessionResponse) => {
        const kind = message.kind;
        if (kind.case === "opened" && !opened) {
          opened = true;
          this.#stream = stream;
          this.#ended = ended.promise;
          this.sessionId = kind.value.sessionId;
          resolve();
        } else if (kind.case === "provide") {
          void this.#answer(stream, kind.value);
        } else if (kind.case === "cancel") {
          this.#answering.get(kind.value.callId)?.abort();
        }
      });
      stream.on("error", () => undefined); // the status below says it all
      stream.on("status", (status: StatusObject) => {
        ended.resolve();
        if (!opened) {
          reject(
            status.code === Code.OK
              ? new SystemPromptError(
                  "sidecar unavailable: it ended the session stream before opening it",
                  Code.UNAVAILABLE,
                  Reason.SIDECAR_UNAVAILABLE,
                )
              : errorFromGrpc(status),
          );
        } else if (stream === this.#stream) {
          this.#sessionLost();
        }
      });
      stream.write(
        create(pb.OpenSessionRequestSchema, {
          kind: { case: "start", value: { clientName: this.clientName, clientVersion: CLIENT_VERSION } },
        }),
      );
    });
  }

  #setConnected(): void {
    this.connected = true;
    this.#up.resolve();
  }

  #sessionLost(): void {
    if (this.closed || this.#reconnecting) return;
    this.connected = false;
    this.#up = new Deferred<void>();
    this.#reconnecting = true;
    void this.#reconnect().finally(() => {
      this.#reconnecting = false;
    });
  }

  async #reconnect(): Promise<void> {
    let delay = 50;
    while (!this.closed) {
      try {
        await sleep(delay, undefined, { signal: this.#closing.signal });
      } catch {
        return; // closed meanwhile
      }
      delay = Math.min(delay * 2, MAX_BACKOFF_MS);
      try {
        await this.#openSession();
        const stream = this.#stream;
        await this.#replay();
        if (stream !== this.#stream || this.closed) continue;
      } catch (error) {
        if (error instanceof SystemPromptError) continue; // still down: try again
        throw error;
      }
      this.#setConnected();
      return;
    }
  }

  async #replay(): Promise<void> {
    for (const registration of this.registrations) {
      registration.stream?.close();
      registration.stream = undefined;
    }
    for (const registration of [...this.registrations]) {
      if (this.registrations.has(registration)) await this.#make(registration); // not disposed meanwhile
    }
  }

  // -- calls ------------------------------------------------------------------------

  /** A unary call for this session; gRPC failures become SystemPromptError. */
  async call<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageShape<I>,
    timeoutMs?: number,
    signal?: AbortSignal,
  ): Promise<MessageShape<O>> {
    await this.ready(timeoutMs);
    const deadline = timeoutMs === undefined ? undefined : new Date(Date.now() + timeoutMs);
    try {
      return await this.rpc.unary(method, request, deadline, signal);
    } catch (error) {
      throw errorFromGrpc(error as StatusObject);
    }
  }

  /** Fail fast while reconnecting, or wait up to `timeoutMs` when one is given. */
  async ready(timeoutMs?: number): Promise<void> {
    this.checkOpen();
    if (this.connected) return;
    if (timeoutMs !== undefined) {
      await Promise.race([this.#up.promise, sleep(timeoutMs, undefined, { ref: false })]);
      this.checkOpen();
      if (this.connected) return;
    }
    throw new SystemPromptError(
      "sidecar unavailable: the connection is down and being re-established",
      Code.UNAVAILABLE,
      Reason.SIDECAR_UNAVAILABLE,
    );
  }

  checkOpen(): void {
    if (this.closed) {
      throw new SystemPromptError(
        "this client is closed: its session and registrations are gone",
        Code.FAILED_PRECONDITION,
        Reason.SESSION_CLOSED,
      );
    }
  }

  /** Make a registration and keep it for replay; nothing is kept if it fails. */
  async register(registration: Registration): Promise<void> {
    try {
      await this.ready();
      await this.#make(registration);
    } catch (error) {
      if (registration.providerKey !== undefined) this.#providers.delete(registration.providerKey);
      throw error;
    }
    this.registrations.add(registration);
  }

  /** Dispose `registration` (and, for a scope, everything made through it). */
  async dispose(registration: Registration): Promise<void> {
    for (const child of [...this.registrations]) {
      if (child.scope === registration) this.#forget(child);
    }
    this.#forget(registration);
    if (this.closed || !this.connected || !registration.registrationId) {
      return; // the sidecar has nothing of it now; nothing to replay later either
    }
    const request = create(pb.DisposeRequestSchema, {
      sessionId: this.sessionId,
      registrationId: registration.registrationId,
    });
    try {
      await this.call(pb.SystemPromptService.method.dispose, request);
    } catch (error) {
      // NOT_FOUND: gone already; a dispose is idempotent.
      if (!(error instanceof SystemPromptError && error.code === Code.NOT_FOUND)) throw error;
    }
  }

  #forget(registration: Registration): void {
    this.registrations.delete(registration);
    if (registration.providerKey !== undefined) this.#providers.delete(registration.providerKey);
    registration.stream?.close();
    registration.stream = undefined;
  }

  async #make(registration: Registration): Promise<void> {
    const scopeId = registration.scope?.registrationId ?? "";
    const made = await registration.make(this.rpc, this.sessionId, scopeId);
    registration.registrationId = made.id;
    registration.stream = made.stream;
  }

  // -- dynamic providers ------------------------------------------------------------

  /** Keep `provider` here; the returned key is what the sidecar asks for. */
  addProvider(provider: Provider): string {
    this.#keys += 1;
    const key = `p${this.#keys}`;
    this.#providers.set(key, provider);
    return key;
  }

  async #answer(stream: SessionStream, request: pb.ProvideRequest): Promise<void> {
    const controller = new AbortController();
    this.#answering.set(request.callId, controller);
    const context = contextFromProto(request.context, controller.signal);
    let values: pb.ProvidedValue[];
    try {
      values = await Promise.all(request.calls.map((call) => this.#value(call, context)));
    } finally {
      this.#answering.delete(request.callId);
    }
    if (controller.signal.aborted) return; // the sidecar gave up on this request
    try {
      stream.write(
        create(pb.OpenSessionRequestSchema, {
          kind: { case: "provided", value: { callId: request.callId, values } },
        }),
      );
    } catch {
      // the session is over: that assembly has failed already
    }
  }

  async #value(call: pb.ProvideCall, context: AssembleContext): Promise<pb.ProvidedValue> {
    try {
      const provider = this.#providers.get(call.providerKey);
      if (provider === undefined) throw new ReferenceError("the provider was disposed in this client");
      const value: pb.ProvidedValue["value"] = fill(call.kind, await provider(context));
      return create(pb.ProvidedValueSchema, { providerKey: call.providerKey, value });
    } catch (error) {
      // The provider's failure fails the assembly, not this client.
      return create(pb.ProvidedValueSchema, {
        providerKey: call.providerKey,
        value: { case: "error", value: { message: describe(error) } },
      });
    }
  }
}

function fill(kind: pb.ProviderKind, value: unknown): pb.ProvidedValue["value"] {
  if (kind === pb.ProviderKind.TOOLS) {
    return { case: "tools", value: toolsToProto(value as Parameters<typeof toolsToProto>[0]) };
  }
  if (kind === pb.ProviderKind.VARIABLE) {
    if (value === undefined || value === null) return { case: "noValue", value: create(pb.NoValueSchema) };
    if (typeof value === "string") return { case: "variableValue", value };
    throw new TypeError(`a variable provider must return a string or undefined, not ${String(value)}`);
  }
  if (typeof value === "string") return { case: "text", value };
  throw new TypeError(`a text provider must return a string, not ${String(value)}`);
}
