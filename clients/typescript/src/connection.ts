/**
 * The connection: one channel, one session at a time, and reconnecting when a session is lost.
 *
 * Every registration is kept as a `Registration` (what makes it), in the order it
 * was made. When the session ends without the client closing it (the sidecar
 * restarted, the network dropped, a listener stream or a call went unanswered),
 * the connection opens a new session with backoff and makes every registration
 * again in that order, so assemblies after the restart equal those before it.
 * Disposers point at registrations, so they keep working across restarts.
 */

import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { StatusObject } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { Deferred, pause, within } from "./async.js";
import type { Closable } from "./closable.js";
import { Code, NoAnswer, Reason, SystemPromptError, errorFromGrpc } from "./errors.js";
import type { ListenerStream } from "./listeners.js";
import type { LocalCache } from "./localCache.js";
import { Providers } from "./providers.js";
import type { Method, Rpc } from "./rpc.js";
import { Session } from "./session.js";

/** One registration this client owns, and how to make it (again) for a session. */
export interface Registration {
  /** Makes the registration on `sessionId` (in `scopeId`'s layer) within `timeoutMs`; resolves to its id. */
  make(
    rpc: Rpc,
    sessionId: string,
    scopeId: string,
    timeoutMs: number,
  ): Promise<{ id: string; stream?: ListenerStream; revision?: number }>;
  /** The scope handle it was made through. */
  scope?: Registration | undefined;
  providerKey?: string | undefined;
  registrationId: string;
  stream?: ListenerStream | undefined;
}

/** For what the sidecar answers at once: session, listener and watch opens, registrations, disposals. */
export const CALL_TIMEOUT_MS = 10_000;
const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 2_000;
const READY_POLL_MS = 1_000; // the channel's own reconnect backoff is at most 2 s (see rpc.ts)
/** An ejected callback is made again after this, doubled with each ejection of it up to the max. */
const FIRST_EJECT_BACKOFF_MS = 1_000;
const MAX_EJECT_BACKOFF_MS = 30_000;
const EJECT_CALM_MS = 60_000; // an ejection this long after the last one starts the backoff again

/** Owns the channel, the current session, the registrations and the providers. */
export class Connection {
  readonly rpc: Rpc;
  readonly clientName: string;
  readonly callTimeoutMs: number;
  readonly providers = new Providers();
  closed = false;
  connected = false;
  /** Registrations in the order they were made (a Set keeps insertion order). */
  readonly registrations = new Set<Registration>();
  /** Change and prompt streams, closed with the client. */
  readonly streams = new Set<Closable>();
  /** `connect(address, { localCache: true })`'s. */
  local: LocalCache | undefined;
  #session: Session | undefined;
  #reconnecting: Promise<void> | undefined;
  #up = new Deferred<void>();
  readonly #closing = new AbortController();
  readonly #ejections = new WeakMap<Registration, { count: number; last: number }>();

  constructor(rpc: Rpc, clientName: string, callTimeoutMs: number = CALL_TIMEOUT_MS) {
    this.rpc = rpc;
    this.clientName = clientName;
    this.callTimeoutMs = callTimeoutMs;
  }

  /** The current session's id; the lost one's until a new one is open. */
  get sessionId(): string {
    return this.#session?.id ?? "";
  }

  // -- life cycle -------------------------------------------------------------------

  /** Open the first session, confirmed within `timeoutMs` (default: the call timeout). */
  async open(timeoutMs: number = this.callTimeoutMs): Promise<void> {
    await this.#startSession(timeoutMs);
    this.#setConnected();
  }

  /** Open the first session once the sidecar at `address` serves, within `timeoutMs`. */
  async openWhenReady(address: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const left = deadline - Date.now();
      try {
        await this.open(Math.max(1, Math.min(this.callTimeoutMs, left)));
        return;
      } catch (error) {
        if (!(error instanceof SystemPromptError && error.code === Code.UNAVAILABLE)) throw error;
      }
      if (Date.now() >= deadline) throw notReady(address, timeoutMs);
      // Wake on the channel's next connection, or poll: a READY channel to a
      // draining sidecar still refuses sessions.
      const poll = Math.min(READY_POLL_MS, Math.max(1, deadline - Date.now()));
      await this.rpc.waitForReady(new Date(Date.now() + poll)).catch(() => undefined);
      await pause(FIRST_BACKOFF_MS);
    }
  }

  /** End the session: the sidecar disposes everything it registered. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.connected = false;
    this.#closing.abort();
    for (const stream of [...this.streams]) stream.close();
    await this.local?.close();
    await this.#reconnecting?.catch(() => undefined);
    for (const registration of this.registrations) registration.stream?.close();
    await this.#session?.end();
    this.rpc.close();
  }

  async #startSession(timeoutMs: number = this.callTimeoutMs): Promise<void> {
    const session = await Session.open(
      this.rpc,
      this.clientName,
      this.providers,
      (lost) => this.#lost(lost),
      timeoutMs,
    );
    this.#session = session;
    session.onEjected = (ejected) => {
      const registration = [...this.registrations].find((r) => r.registrationId === ejected.registrationId);
      if (registration !== undefined && session === this.#session) this.ejected(registration, session.id);
    };
    try {
      for (const disposed of await this.#replay(session.id)) await this.#disposeOn(session.id, disposed);
    } catch (error) {
      await session.end(); // leave nothing half-replayed on the sidecar
      throw error;
    }
  }

  #setConnected(): void {
    this.connected = true;
    this.#up.resolve();
  }

  /**
   * The sidecar ejected `registration` (it did not answer in time) from the session
   * `sessionId`: make it again there after a backoff that doubles with each ejection of
   * it, so the disposer the agent holds stays valid. After a reconnect the replay made
   * it already; a disposed one is not made again.
   */
  ejected(registration: Registration, sessionId: string = this.sessionId): void {
    void this.#reinstall(registration, sessionId, this.#backoff(registration));
  }

  /**
   * The stream of `registration`'s listener ended while its session `sessionId` lives (the
   * sidecar closed it, and keeps the listener's place, failing what it would see, until it
   * is back): install it again on that session, at once the first time, then with the
   * ejection backoff. The session and its other registrations stay; a lost session is
   * made again, and replays it, on its own.
   */
  lost(registration: Registration, sessionId: string): void {
    void this.#reinstall(registration, sessionId, this.#backoff(registration) - FIRST_EJECT_BACKOFF_MS);
  }

  #backoff(registration: Registration): number {
    const now = Date.now();
    const before = this.#ejections.get(registration);
    const count = before === undefined || now - before.last > EJECT_CALM_MS ? 1 : before.count + 1;
    this.#ejections.set(registration, { count, last: now });
    return Math.min(FIRST_EJECT_BACKOFF_MS * 2 ** (count - 1), MAX_EJECT_BACKOFF_MS);
  }

  async #reinstall(registration: Registration, sessionId: string, delay: number): Promise<void> {
    if ((await pause(delay, this.#closing.signal)) === "aborted") return;
    if (this.closed || !this.registrations.has(registration) || this.sessionId !== sessionId) return;
    registration.stream?.close(); // an ejected (or lost) listener's stream has ended
    registration.stream = undefined;
    try {
      await this.#make(registration, sessionId);
    } catch {
      return; // its session is going: the reconnect's replay makes it
    }
    if (this.closed) return closeStream(registration); // closed while it was made: close() did not see it
    if (!this.registrations.has(registration)) await this.#disposeOn(sessionId, registration); // the disposer wins
  }

  #lost(session: Session): void {
    if (session === this.#session) this.#startOver(undefined);
  }

  /**
   * The sidecar and this client may disagree on what is registered (a call went
   * unanswered, a listener stream was dropped): end the session, open a new one
   * and replay, so that this client's registrations are the truth again.
   */
  restart(): void {
    this.#startOver(this.#session);
  }

  #startOver(ending: Session | undefined): void {
    if (this.closed || this.#reconnecting !== undefined) return;
    this.connected = false;
    this.#up = new Deferred<void>();
    this.#reconnecting = this.#reconnect(ending).finally(() => {
      this.#reconnecting = undefined;
    });
  }

  async #reconnect(ending: Session | undefined): Promise<void> {
    await ending?.end(); // the sidecar disposes all of it, whatever it kept
    let delay = FIRST_BACKOFF_MS;
    while (!this.closed) {
      if ((await pause(delay, this.#closing.signal)) === "aborted") return;
      delay = Math.min(delay * 2, MAX_BACKOFF_MS);
      try {
        await this.#startSession();
      } catch {
        continue; // still down, or the replay failed (its session is ended): try again
      }
      if (this.closed) {
        await this.#session?.end();
        return;
      }
      if (this.#session?.ended) continue; // the session ended during its replay: its registrations went with it
      this.#setConnected();
      return;
    }
  }

  /**
   * Make every registration again on the new session, in the original order. Returns
   * those made here and disposed while the replay went on: the sidecar still holds
   * them, and the caller disposes them there (the disposer wins).
   */
  async #replay(sessionId: string): Promise<Registration[]> {
    for (const registration of this.registrations) {
      registration.stream?.close(); // a lost session's listener streams went with it
      registration.stream = undefined;
    }
    const made: Registration[] = [];
    for (const registration of [...this.registrations]) {
      if (!this.registrations.has(registration)) continue; // disposed meanwhile
      await this.#make(registration, sessionId);
      made.push(registration);
    }
    return made.filter((registration) => !this.registrations.has(registration));
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
      await within(this.#up.promise, timeoutMs);
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

  // -- registrations ----------------------------------------------------------------

  /** Make a registration and keep it for replay; nothing is kept if it fails. */
  async register(registration: Registration): Promise<void> {
    let revision: number | undefined;
    try {
      await this.ready();
      revision = await this.#make(registration, this.sessionId);
    } catch (error) {
      this.providers.remove(registration.providerKey);
      if (error instanceof NoAnswer) this.restart(); // it may be registered there: a new session drops it
      throw error;
    }
    this.registrations.add(registration);
    this.wrote(revision);
  }

  /**
   * This client changed the registry (its reply said `revision`; undefined: not said):
   * the local cache serves nothing older (read-your-writes).
   */
  wrote(revision: number | undefined): void {
    this.local?.wrote(revision);
  }

  /** Dispose `registration` (and, for a scope, everything made through it). */
  async dispose(registration: Registration): Promise<void> {
    for (const child of [...this.registrations]) {
      if (child.scope === registration) this.#forget(child);
    }
    const stream = registration.stream;
    registration.stream = undefined;
    this.#forget(registration);
    // A listener's stream's end disposes it; else, or if it did not end so, a Dispose.
    if (stream !== undefined) {
      if (!this.#holds(registration)) stream.close();
      else if (await stream.end(this.callTimeoutMs)) return; // end closes it either way
    }
    if (!this.#holds(registration)) return; // the sidecar has nothing of it now, nor a replay later
    await this.#disposeOn(this.sessionId, registration);
  }

  /** Whether the sidecar may hold `registration` on the current session. */
  #holds(registration: Registration): boolean {
    return !this.closed && this.connected && registration.registrationId !== "";
  }

  /**
   * Replace `registration`'s value on the sidecar with `request`, then in what a
   * replay makes (`apply`); resolves to the registry's revision after it.
   */
  async update(
    registration: Registration,
    request: pb.UpdateRequest,
    apply: () => void,
    timeoutMs?: number,
  ): Promise<number> {
    await this.ready(timeoutMs);
    request.sessionId = this.sessionId; // after the wait: the current session
    request.registrationId = registration.registrationId;
    const reply = await this.call(pb.SystemPromptService.method.update, request);
    if (this.registrations.has(registration)) apply(); // not disposed meanwhile
    this.wrote(Number(reply.revision));
    return Number(reply.revision);
  }

  /**
   * Drop the sidecar's cached answers of `registration`'s provider, or results of its
   * listener; done once the sidecar confirms, within the call timeout. Nothing to do for
   * a static value, a disposed registration or while disconnected (the reconnect makes
   * every registration again, which drops every cached answer).
   */
  async invalidate(registration: Registration): Promise<void> {
    if (this.closed || !this.connected || !this.registrations.has(registration)) return;
    if (registration.stream !== undefined) return registration.stream.invalidate(this.callTimeoutMs);
    if (registration.providerKey !== undefined && this.#session !== undefined) {
      return this.#session.invalidate([registration.providerKey], this.callTimeoutMs);
    }
  }

  async #disposeOn(sessionId: string, registration: Registration): Promise<void> {
    const request = create(pb.DisposeRequestSchema, { sessionId, registrationId: registration.registrationId });
    try {
      const deadline = new Date(Date.now() + this.callTimeoutMs);
      const reply = await this.rpc.unary(pb.SystemPromptService.method.dispose, request, deadline);
      this.wrote(Number(reply.revision));
    } catch (rpcError) {
      const error = answerError(rpcError, "Dispose", this.callTimeoutMs);
      if (error instanceof NoAnswer) this.restart(); // it may still be registered there: a new session drops it
      if (error.code !== Code.NOT_FOUND) throw error; // NOT_FOUND: gone already
    }
  }

  #forget(registration: Registration): void {
    this.registrations.delete(registration);
    this.providers.remove(registration.providerKey);
    registration.stream?.close();
    registration.stream = undefined;
  }

  /** Make `registration` on `sessionId`; resolves to the revision its reply said, if any. */
  async #make(registration: Registration, sessionId: string): Promise<number | undefined> {
    const scopeId = registration.scope?.registrationId ?? "";
    const made = await registration.make(this.rpc, sessionId, scopeId, this.callTimeoutMs);
    registration.registrationId = made.id;
    registration.stream = made.stream;
    return made.revision;
  }
}

/** Close `registration`'s stream, if it has one (a listener's). */
function closeStream(registration: Registration): void {
  registration.stream?.close();
}

/** The error for a call the sidecar answers at once: our own deadline is NoAnswer. */
export function answerError(error: unknown, what: string, timeoutMs: number): SystemPromptError {
  if (error instanceof SystemPromptError) return error;
  const failure = errorFromGrpc(error as StatusObject);
  if (failure.code === Code.DEADLINE_EXCEEDED && failure.reason === Reason.UNKNOWN) {
    return new NoAnswer(what, timeoutMs);
  }
  return failure;
}

/** Connecting to `address` took longer than `timeoutMs`. */
export function notReady(address: string, timeoutMs: number): SystemPromptError {
  return new SystemPromptError(
    `sidecar unavailable: no session with ${address} within ${timeoutMs / 1000}s`,
    Code.UNAVAILABLE,
    Reason.SIDECAR_UNAVAILABLE,
  );
}
