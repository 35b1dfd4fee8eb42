/** A waterfall listener's stream: invocations in, next() and results out. */

import { create } from "@bufbuild/protobuf";
import type { ClientDuplexStream } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { Deferred, within } from "./async.js";
import { FEATURE_CALLBACK_CACHE, Invalidations } from "./callbackCache.js";
import { openCallbackStream } from "./callbackStream.js";
import { contextFromProto } from "./convert.js";
import { Code, Reason, SystemPromptError } from "./errors.js";
import { Invocation, Parts, type Slotted } from "./partSlots.js";
import { describe } from "./providers.js";
import type { Rpc } from "./rpc.js";
import type { AssembleContext, PromptAssembly } from "./types.js";

/**
 * The `next` a listener receives: hands `assembly` (default: the one the
 * listener got) to the rest of the chain and resolves to what it returned.
 * Callable once per invocation.
 */
export type NextFn = (assembly?: PromptAssembly) => Promise<PromptAssembly>;

/**
 * A waterfall listener. It may change `assembly` and `return next()`, post-process
 * `await next()`, or return an assembly of its own without calling `next()`.
 *
 * `return next()` without awaiting it is a tail call: what the rest of the chain
 * returns is this listener's result, untouched, and it costs one round trip instead
 * of two. Any `await` of next()'s promise (or a callback on it) is not a tail call.
 */
export type Listener = (
  assembly: PromptAssembly,
  context: AssembleContext,
  next: NextFn,
) => PromptAssembly | Promise<PromptAssembly>;

/** A label for errors and change events: the function's name, kept short. */
export function label(name: string): string {
  // The end of a qualified name is the telling part: keep it.
  const points = Array.from(name);
  return points.length <= LABEL_LIMIT ? name : "…" + points.slice(1 - LABEL_LIMIT).join("");
}

const LABEL_LIMIT = 120;
/** The ListenStart feature: this client decodes ListenerNextResult.tool_slots. */
export const FEATURE_TOOL_SLOTS = "tool-slots";
/** The ListenStart feature: this client keeps the stream's base and reads and sends PartSlots. */
export const FEATURE_PART_SLOTS = "part-slots";
const TAIL = Symbol("tail call sent");

type ListenStream = ClientDuplexStream<pb.ListenRequest, pb.ListenResponse>;

interface Waiting {
  resolve(result: pb.ListenerNextResult): void;
  reject(error: Error): void;
}

/** Runs one listener for every invocation the sidecar sends. */
export class ListenerStream {
  readonly #rpc: Rpc;
  readonly #listener: Listener;
  readonly #onLost: () => void;
  readonly #onEjected: (why: string) => void;
  /** Why the sidecar ejected it, once it said so: its stream's end then installs it again. */
  #ejected = "";
  #call: ListenStream | undefined;
  #closing = false;
  /** Resolves at the stream's end: whether it ended with OK (the sidecar disposed the listener). */
  readonly #over = new Deferred<boolean>();
  #ended = false;
  /** What the sidecar confirmed (`part-slots`, else `tool-slots`): only that do replies carry. */
  #slotted: Slotted = undefined;
  /** With `part-slots`, the last invocation's parts: the next one's slots refer to them. */
  #base: Parts | undefined;
  /** The sidecar confirmed `callback-cache`: invalidations are sent and wait for its answer. */
  #callbackCache = false;
  readonly #invalidations = new Invalidations();
  readonly #running = new Map<bigint, AbortController>();
  readonly #nextResults = new Map<bigint, Waiting>();

  /**
   * `onLost` hears when the sidecar ends the stream while this client keeps the listener;
   * `onEjected` instead when the sidecar ejected it first (it did not answer in time).
   */
  constructor(
    rpc: Rpc,
    listener: Listener,
    onLost: () => void = () => undefined,
    onEjected: (why: string) => void = () => undefined,
  ) {
    this.#rpc = rpc;
    this.#listener = listener;
    this.#onLost = onLost;
    this.#onEjected = onEjected;
  }

  /** Install the listener, confirmed within `timeoutMs`; resolves to its registration id. */
  start(start: pb.ListenStart, timeoutMs: number): Promise<string> {
    const call = this.#rpc.bidi(pb.SystemPromptService.method.listen);
    this.#call = call;
    const begin = create(pb.ListenRequestSchema, { kind: { case: "start", value: start } });
    return openCallbackStream(call, begin, timeoutMs, {
      doing: "installing a listener",
      unconfirmed: "the listener stream did not start with ListenerRegistered",
      endedEarly: "it closed the listener stream",
      confirm: (first) => {
        const kind = first.kind;
        if (kind.case !== "registered" || !kind.value.registrationId) return undefined;
        // Only what both sides support: a sidecar that confirms no feature gets none.
        const both = (feature: string) => start.features.includes(feature) && kind.value.features.includes(feature);
        this.#slotted = both(FEATURE_PART_SLOTS) ? "parts" : both(FEATURE_TOOL_SLOTS) ? "tools" : undefined;
        this.#callbackCache = both(FEATURE_CALLBACK_CACHE);
        return kind.value.registrationId;
      },
      receive: (message) => this.#receive(message),
      ended: (opened, status) => {
        this.#ended = true;
        this.#over.resolve(status.code === Code.OK);
        this.#invalidations.release(); // the listener's cached results went with its stream
        for (const id of [...this.#running.keys()]) this.#abandon(id); // their replies have nowhere to go
        if (!opened || this.#closing) return;
        if (this.#ejected) this.#onEjected(this.#ejected); // it did not answer in time: installed again
        else this.#onLost(); // the stream ended under it: installed again on the same session
      },
    });
  }

  #receive(message: pb.ListenResponse): void {
    const kind = message.kind;
    if (kind.case === "invocation") {
      if (this.#closing) return; // off() half-closed the stream: its end fails this invocation
      const sent = this.#read(kind.value);
      if (sent !== undefined && !this.#running.has(kind.value.invocationId)) void this.#invoke(kind.value, sent); // else: a repeat, running
    } else if (kind.case === "nextResult") {
      this.#nextResults.get(kind.value.invocationId)?.resolve(kind.value);
    } else if (kind.case === "cancel") {
      this.#abandon(kind.value.invocationId);
    } else if (kind.case === "ejected") {
      this.#ejected = kind.value.message || kind.value.reason || "ejected";
    } else if (kind.case === "invalidated") {
      this.#invalidations.confirmed(kind.value.invalidateId);
    }
    // A next_result nobody waits for, a second `registered` and a kind this client
    // does not know (a newer sidecar's) are ignored.
  }

  /**
   * An invocation's parts, read here in the stream's order: with `part-slots` each is
   * the base of the next. One whose slots cannot be right is failed, and the stream,
   * whose base is lost, half-closed: the sidecar ends it and the listener is installed again.
   */
  #read(invocation: pb.ListenerInvocation): Invocation | undefined {
    const parts = this.#slotted === "parts";
    try {
      const read = Parts.received(invocation.assembly, parts ? invocation.slots : undefined, this.#base);
      if (parts) this.#base = read;
      return new Invocation(read, this.#slotted);
    } catch (error) {
      this.#base = undefined;
      const failure = { invocationId: invocation.invocationId, message: describe(error) };
      this.write(create(pb.ListenRequestSchema, { kind: { case: "failure", value: failure } }));
      this.#call?.end();
      return undefined;
    }
  }

  /**
   * Drop the sidecar's cached results of this listener; done once it confirms, within
   * `timeoutMs`. A sidecar without the feature caches nothing to drop.
   */
  async invalidate(timeoutMs: number): Promise<void> {
    if (!this.#callbackCache || this.#closing) return;
    const send = (invalidate: pb.CacheInvalidate): void =>
      this.write(create(pb.ListenRequestSchema, { kind: { case: "invalidate", value: invalidate } }));
    await this.#invalidations.await(send, timeoutMs);
  }

  /**
   * Dispose the listener through its own stream: half-closed, the sidecar disposes it and
   * then ends the stream with OK. Resolves true once that end came within `timeoutMs`: the
   * listener is gone, no assembly sees it any more. False when the stream was over already,
   * ended otherwise (the listener may be away, not gone) or not in time: then it is for a
   * Dispose to say. The stream is closed here either way.
   */
  async end(timeoutMs: number): Promise<boolean> {
    const call = this.#call;
    if (call === undefined || this.#closing || this.#ended) {
      this.close();
      return false;
    }
    this.#closing = true; // its end is this client's: nothing to install again
    for (const id of [...this.#running.keys()]) this.#abandon(id); // their answers would come after it
    call.end(); // after what was written before
    const ended = await within(this.#over.promise, timeoutMs);
    this.close();
    return ended === true;
  }

  /** End the stream: the sidecar removes the listener. */
  close(): void {
    this.#closing = true;
    this.#invalidations.release(); // the listener goes, and its cached results with it
    for (const id of [...this.#running.keys()]) this.#abandon(id);
    this.#call?.cancel();
  }

  #abandon(invocationId: bigint): void {
    this.#running.get(invocationId)?.abort();
    this.#running.delete(invocationId);
    this.#nextResults
      .get(invocationId)
      ?.reject(new SystemPromptError("the sidecar abandoned this invocation", Code.CANCELLED, Reason.UNKNOWN));
  }

  async #invoke(invocation: pb.ListenerInvocation, sent: Invocation): Promise<void> {
    const id = invocation.invocationId;
    const controller = new AbortController();
    this.#running.set(id, controller);
    const assembly = sent.view();
    const context = contextFromProto(invocation.context, controller.signal);
    let reply: pb.ListenRequest;
    try {
      const tail = new Deferred<typeof TAIL>();
      let call: NextCall | undefined;
      const next: NextFn = (handed) => {
        if (call !== undefined) {
          throw new SystemPromptError(
            "next() may be called once per invocation",
            Code.FAILED_PRECONDITION,
            Reason.LISTENER_FAILED,
          );
        }
        call = new NextCall(this, id, handed ?? assembly, sent, controller.signal, () => tail.resolve(TAIL));
        return call.promise;
      };
      const returned = this.#listener(assembly, context, next);
      if (call !== undefined && returned === call.promise) {
        call.sendTail(); // `return next()` from a plain function
        return;
      }
      const result = await Promise.race([returned, tail.promise]);
      if (result === TAIL) return; // `return next()` from an async function
      if (controller.signal.aborted) return;
      const [message, slots] = sent.encode(result);
      reply = create(pb.ListenRequestSchema, {
        kind: { case: "result", value: { invocationId: id, assembly: message, ...slots } },
      });
    } catch (error) {
      if (controller.signal.aborted) return; // the sidecar abandoned this invocation
      reply = create(pb.ListenRequestSchema, {
        kind: { case: "failure", value: { invocationId: id, message: describe(error) } },
      });
    } finally {
      this.#running.delete(id);
    }
    this.write(reply);
  }

  /** Hand `handed` to the rest of the chain; resolves to what it returned (undefined for a tail call). */
  async next(
    invocationId: bigint,
    handed: PromptAssembly,
    sent: Invocation,
    tail: boolean,
  ): Promise<PromptAssembly | undefined> {
    const [assembly, slots] = sent.encode(handed);
    const message = create(pb.ListenRequestSchema, {
      kind: { case: "next", value: { invocationId, assembly, tail, ...slots } },
    });
    if (tail) {
      this.write(message);
      return undefined;
    }
    const waiting = new Deferred<pb.ListenerNextResult>();
    this.#nextResults.set(invocationId, waiting);
    try {
      this.write(message);
      const returned = await waiting.promise;
      return sent.decode(returned.assembly, returned.slots, returned.toolSlots);
    } finally {
      this.#nextResults.delete(invocationId);
    }
  }

  write(message: pb.ListenRequest): void {
    try {
      this.#call?.write(message);
    } catch {
      // the stream is over; the sidecar has failed or dropped this invocation already
    }
  }
}

/**
 * What `next()` returns: a promise whose round trip starts after the listener's
 * current turn, so that a `return next()` seen by then becomes a tail call.
 *
 * An async function's `return next()` is the one way next()'s promise is adopted
 * after the current turn by the engine's own resolving functions (never by user
 * callbacks, and `await` adopts a native promise without calling its `then`).
 */
class NextCall {
  readonly promise: Promise<PromptAssembly>;
  readonly #stream: ListenerStream;
  readonly #invocationId: bigint;
  readonly #handed: PromptAssembly;
  readonly #sent: Invocation;
  readonly #signal: AbortSignal;
  readonly #onTail: () => void;
  readonly #settle = new Deferred<PromptAssembly>();
  #state: "undecided" | "sent" | "tail" = "undecided";
  #turnPassed = false;

  constructor(
    stream: ListenerStream,
    invocationId: bigint,
    handed: PromptAssembly,
    sent: Invocation,
    signal: AbortSignal,
    onTail: () => void,
  ) {
    this.#stream = stream;
    this.#invocationId = invocationId;
    this.#handed = handed;
    this.#sent = sent;
    this.#signal = signal;
    this.#onTail = onTail;
    const promise = this.#settle.promise;
    promise.catch(() => undefined); // a listener need not await next(): no unhandled rejection
    const then = promise.then.bind(promise);
    Object.defineProperty(promise, "then", {
      value: (onFulfilled?: unknown, onRejected?: unknown) => {
        if (this.#turnPassed && isResolvingFunction(onFulfilled) && isResolvingFunction(onRejected)) {
          this.sendTail();
        }
        return then(onFulfilled as never, onRejected as never);
      },
    });
    this.promise = promise;
    queueMicrotask(() => {
      this.#turnPassed = true;
    });
    setImmediate(() => this.#send());
  }

  /** Send the assembly on as a tail call, unless it went already. */
  sendTail(): void {
    if (this.#state !== "undecided") return;
    this.#state = "tail";
    void this.#stream.next(this.#invocationId, this.#handed, this.#sent, true);
    this.#onTail();
  }

  #send(): void {
    if (this.#state !== "undecided") return;
    this.#state = "sent";
    if (this.#signal.aborted) {
      this.#settle.reject(new SystemPromptError("the sidecar abandoned this invocation", Code.CANCELLED, Reason.UNKNOWN));
      return;
    }
    this.#stream.next(this.#invocationId, this.#handed, this.#sent, false).then(
      (result) => this.#settle.resolve(result ?? this.#handed),
      (error: unknown) => this.#settle.reject(error instanceof Error ? error : new Error(String(error))),
    );
  }
}

// The engine's promise resolving functions: anonymous, native.
function isResolvingFunction(value: unknown): boolean {
  return (
    typeof value === "function" &&
    value.name === "" &&
    Function.prototype.toString.call(value).includes("[native code]")
  );
}
