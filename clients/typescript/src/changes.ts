/**
 * The change-event stream as an async iterator that survives sidecar restarts.
 *
 * When the stream breaks (the sidecar restarted, the network dropped, the sidecar
 * ended it), it subscribes again after the last revision it delivered. The sidecar
 * replays what was missed from its history; when it cannot (the history moved on,
 * or a restarted sidecar is a new incarnation), the stream lists the registrations
 * afresh and yields one `ChangesResynced` holding that snapshot, then carries on
 * with the changes after it. Revisions only grow within an incarnation: a sidecar
 * that breaks that rejects with PROTOCOL_ERROR, so a watcher never acts on a wrong
 * picture of the registry.
 */

import { create } from "@bufbuild/protobuf";
import type { ClientReadableStream, ServiceError } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { pause, within } from "./async.js";
import type { Closable } from "./closable.js";
import { changeFromProto } from "./convert.js";
import { Code, NoAnswer, SystemPromptError, errorFromGrpc, protocolError, streamEnded } from "./errors.js";
import type { Rpc } from "./rpc.js";
import { listRegistrations } from "./snapshots.js";
import type { ChangeEvent, ChangesMissed, ChangesResynced } from "./types.js";

/** What a change stream yields. */
export type ChangeItem = ChangeEvent | ChangesMissed | ChangesResynced;

type WatchCall = ClientReadableStream<pb.WatchChangesResponse>;

const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 2_000;
// A stream that breaks with one of these is resumed; any other status ends it with an error.
const RESUMABLE = new Set<number>([Code.UNAVAILABLE, Code.CANCELLED, Code.UNKNOWN, Code.DEADLINE_EXCEEDED]);
const DONE = Symbol("done");

/** A break to resume after: one of RESUMABLE, or a connection cut under the stream. */
function resumable(error: ServiceError): boolean {
  // grpc-js reports a stream reset by a dying connection (no status from the sidecar) as INTERNAL.
  return RESUMABLE.has(error.code) || (error.code === Code.INTERNAL && /^Received RST_STREAM/.test(error.details));
}

/** Told when a change stream breaks (changes may pass unseen) and when it is subscribed again. */
export interface Gaps {
  broke(): void;
  resumed(): void;
}

/** The watch features this client implements: a ChangeBatch holds several events. */
export const WATCH_FEATURES = ["change-batches"];

/**
 * `for await (const item of changes)`: a ChangeEvent per change; ChangesMissed when
 * this watcher fell behind its buffer; ChangesResynced after a restart or a break
 * the sidecar's history could not bridge (rebuild your view from its snapshot).
 *
 * `lastRevision` and `incarnation` are what `watchChanges({afterRevision,
 * incarnation})` takes to resume in another process.
 */
export class ChangeStream implements AsyncIterableIterator<ChangeItem>, Closable {
  /** The registry's revision when the subscription started. */
  revision = 0;
  /** The incarnation of the sidecar the revisions belong to. */
  incarnation: string;
  /** The last revision delivered, or covered by a gap or a snapshot. */
  lastRevision: number;
  readonly #rpc: Rpc;
  readonly #request: pb.WatchChangesRequest;
  readonly #timeoutMs: number;
  readonly #onClose: (stream: ChangeStream) => void;
  readonly #gaps: Gaps | undefined;
  readonly #closing = new AbortController();
  #call: WatchCall | undefined;
  #messages: AsyncIterator<pb.WatchChangesResponse> | undefined;
  readonly #pending: ChangesResynced[] = [];
  /** The rest of a ChangeBatch, as messages of their own, read before the stream's next. */
  readonly #batched: pb.WatchChangesResponse[] = [];
  #skipUntil = 0; // events up to this revision are in a resync's snapshot
  #closed = false;

  private constructor(
    rpc: Rpc,
    request: pb.WatchChangesRequest,
    timeoutMs: number,
    onClose: (stream: ChangeStream) => void,
    gaps: Gaps | undefined,
  ) {
    this.#rpc = rpc;
    this.#gaps = gaps;
    this.#request = request;
    this.#timeoutMs = timeoutMs;
    this.#onClose = onClose;
    this.incarnation = request.incarnation;
    this.lastRevision = Number(request.afterRevision ?? 0);
  }

  /**
   * Subscribe with `request`, confirmed within `timeoutMs` (a refusal rejects here);
   * `onClose` hears when the stream is over for good, `gaps` when it breaks and resumes.
   */
  static async open(
    rpc: Rpc,
    request: pb.WatchChangesRequest,
    timeoutMs: number,
    onClose: (stream: ChangeStream) => void,
    gaps?: Gaps,
  ): Promise<ChangeStream> {
    const stream = new ChangeStream(rpc, request, timeoutMs, onClose, gaps);
    try {
      await stream.#subscribe();
    } catch (error) {
      stream.close();
      throw error;
    }
    stream.revision ||= stream.lastRevision;
    return stream;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<ChangeItem>> {
    for (;;) {
      const pending = this.#pending.shift();
      if (pending !== undefined) return { done: false, value: pending };
      const message = this.#batched.shift() ?? (await this.#read());
      if (message === DONE) return { done: true, value: undefined };
      if (message === undefined) {
        this.#gaps?.broke();
        if ((await this.#resume()) === DONE) return { done: true, value: undefined };
        this.#gaps?.resumed();
        continue;
      }
      const kind = message.kind;
      if (kind.case === "event") {
        if (Number(kind.value.revision) > this.#skipUntil) return { done: false, value: this.#event(kind.value) };
      } else if (kind.case === "missed") {
        return { done: false, value: this.#missed(kind.value) };
      } else if (kind.case === "batch") {
        this.#unbatch(kind.value);
      } else if (kind.case === "subscribed") {
        throw this.#broken("a second WatchSubscribed on the change stream");
      }
      // a kind this client does not know (a newer sidecar's) is skipped
    }
  }

  /** Queue a batch's events (then its gap) as if each had come in a message of its own. */
  #unbatch(batch: pb.ChangeBatch): void {
    for (const event of batch.events) {
      this.#batched.push(create(pb.WatchChangesResponseSchema, { kind: { case: "event", value: event } }));
    }
    if (batch.missed !== undefined) {
      this.#batched.push(create(pb.WatchChangesResponseSchema, { kind: { case: "missed", value: batch.missed } }));
    }
  }

  /** Stop watching (also what `break` out of a `for await` does). */
  async return(): Promise<IteratorResult<ChangeItem>> {
    this.close();
    return { done: true, value: undefined };
  }

  /** Stop watching. */
  close(): void {
    if (!this.#closed) {
      this.#closed = true;
      this.#closing.abort();
      this.#onClose(this);
    }
    this.#call?.cancel();
  }

  /** The next message; undefined when the stream broke and is to be resumed. */
  async #read(): Promise<pb.WatchChangesResponse | undefined | typeof DONE> {
    if (this.#closed || this.#messages === undefined) return DONE;
    let result: IteratorResult<pb.WatchChangesResponse>;
    try {
      result = await this.#messages.next();
    } catch (error) {
      if (this.#closed) return DONE;
      if (resumable(error as ServiceError)) return undefined;
      this.close();
      throw errorFromGrpc(error as ServiceError);
    }
    if (this.#closed) return DONE;
    return result.done ? undefined : result.value; // ended by the sidecar (draining, restarting): resume
  }

  /** Subscribe again after the last revision delivered, with backoff until it works. */
  async #resume(): Promise<void | typeof DONE> {
    this.#request.afterRevision = BigInt(this.lastRevision);
    this.#request.incarnation = this.incarnation;
    let delay = FIRST_BACKOFF_MS;
    while (!this.#closed) {
      try {
        await this.#subscribe();
        return;
      } catch (error) {
        if (this.#closed) return DONE;
        if (!(error instanceof SystemPromptError && RESUMABLE.has(error.code))) {
          this.close();
          throw error;
        }
      }
      await pause(delay, this.#closing.signal);
      delay = Math.min(delay * 2, MAX_BACKOFF_MS);
    }
    return DONE;
  }

  async #subscribe(): Promise<void> {
    const call: WatchCall = this.#rpc.serverStream(pb.SystemPromptService.method.watchChanges, this.#request);
    this.#call = call;
    const messages = call[Symbol.asyncIterator]() as AsyncIterator<pb.WatchChangesResponse>;
    const reading = messages.next();
    reading.catch(() => undefined); // read below, or abandoned with the call
    let first: IteratorResult<pb.WatchChangesResponse> | "timeout";
    try {
      first = await within(reading, this.#timeoutMs);
    } catch (error) {
      throw errorFromGrpc(error as ServiceError);
    }
    if (first === "timeout") {
      call.cancel(); // a silent sidecar keeps no stream of ours
      throw new NoAnswer("watching changes", this.#timeoutMs);
    }
    if (first.done) throw streamEnded("it closed the change stream", { code: Code.OK });
    if (first.value.kind.case !== "subscribed") {
      call.cancel();
      throw protocolError("the change stream did not start with WatchSubscribed");
    }
    if (this.#closed) {
      call.cancel();
      return;
    }
    this.#messages = messages;
    const subscribed = first.value.kind.value;
    const restarted = Boolean(this.incarnation) && subscribed.incarnation !== this.incarnation;
    this.incarnation = subscribed.incarnation;
    if (this.#request.afterRevision === undefined) {
      this.lastRevision = this.revision = Number(subscribed.revision);
    } else if (subscribed.resync) {
      try {
        await this.#resync(restarted);
      } catch (error) {
        call.cancel();
        throw error;
      }
    }
  }

  /** Take a listing: the events it already holds are skipped from here on. */
  async #resync(restarted: boolean): Promise<void> {
    const request = create(pb.ListRegistrationsRequestSchema, { filter: this.#request.filter });
    const snapshot = await listRegistrations(this.#rpc, request, this.#timeoutMs);
    this.#skipUntil = this.lastRevision = snapshot.revision;
    this.incarnation = snapshot.incarnation;
    this.#pending.push({ type: "resynced", reason: restarted ? "restarted" : "behind", snapshot });
  }

  #event(message: pb.ChangeEvent): ChangeEvent {
    const revision = Number(message.revision);
    if (revision <= this.lastRevision) throw this.#broken(`change event ${revision} after ${this.lastRevision}`);
    this.lastRevision = revision;
    return changeFromProto(message);
  }

  #missed(message: pb.ChangesMissed): ChangesMissed {
    const [first, count, resync] = [message.firstMissedRevision, message.count, message.resyncRevision].map(Number) as [
      number,
      number,
      number,
    ];
    if (first <= this.lastRevision || count < 1 || resync < first) {
      throw this.#broken(`missed ${count} changes from ${first} to ${resync} after ${this.lastRevision}`);
    }
    this.lastRevision = resync;
    return { type: "missed", firstRevision: first, count, resyncRevision: resync };
  }

  /** End the stream: a watcher must not act on events out of order. */
  #broken(what: string): SystemPromptError {
    this.close();
    return protocolError(what);
  }
}
