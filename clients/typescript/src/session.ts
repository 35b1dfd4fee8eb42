/**
 * The session stream's life cycle: open it, read it until it ends, end it.
 *
 * A session is one `OpenSession` stream; everything registered on it lives as
 * long as the stream does. While open, the sidecar asks on it for provider values
 * (answered by `Providers`). When it ends without this client ending it, the
 * connection is told, and reconnects and replays.
 */

import { create, toBinary } from "@bufbuild/protobuf";
import type { ClientDuplexStream } from "@grpc/grpc-js";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { Deferred, within } from "./async.js";
import { FEATURE_CALLBACK_CACHE, Invalidations } from "./callbackCache.js";
import { openCallbackStream } from "./callbackStream.js";
import type { Providers } from "./providers.js";
import type { Rpc } from "./rpc.js";

type SessionStream = ClientDuplexStream<pb.OpenSessionRequest, pb.OpenSessionResponse>;

/**
 * Offered in SessionStart: this client answers a ProvideRequest provider by provider, so
 * the sidecar judges each against its own time and a slow provider gets no other ejected
 * with it (docs/protocol.md, "Versions and features").
 */
const FEATURE_EACH_ANSWER = "each-answer";

/** Sent in SessionStart, for the sidecar's logs only. */
export const CLIENT_VERSION = "dsh-system-prompt-typescript/0.1.0";
const END_WAIT_MS = 5_000; // how long ending waits for the sidecar to close its side

/** One open session stream: its id, and the provider answers running on it. */
export class Session {
  readonly id: string;
  /** The sidecar's version as it said at open (diagnostics only). */
  readonly sidecarVersion: string;
  readonly #stream: SessionStream;
  readonly #providers: Providers;
  readonly #finished: Promise<void>;
  readonly #answering = new Map<bigint, AbortController>();
  /** The largest message the sidecar reads (0: not said): a message over it would end the session. */
  readonly #maxMessageBytes: number;
  /** The sidecar confirmed `each-answer`: each value goes as soon as its provider returns. */
  readonly #eachAnswer: boolean;
  /** The sidecar confirmed `callback-cache`: invalidations are sent and wait for its answer. */
  readonly #callbackCache: boolean;
  readonly #invalidations = new Invalidations();
  #ending = false;
  #ended = false;
  /** Hears that the sidecar ejected one of this session's providers (it did not answer in time). */
  onEjected: (ejected: pb.CallbackEjected) => void = () => undefined;

  private constructor(stream: SessionStream, opened: pb.SessionOpened, providers: Providers, finished: Promise<void>) {
    this.#stream = stream;
    this.id = opened.sessionId;
    this.sidecarVersion = opened.sidecarVersion;
    this.#providers = providers;
    this.#finished = finished;
    this.#maxMessageBytes = Number(opened.maxMessageBytes);
    this.#eachAnswer = opened.features.includes(FEATURE_EACH_ANSWER);
    this.#callbackCache = opened.features.includes(FEATURE_CALLBACK_CACHE);
  }

  /** Open a session, confirmed within `timeoutMs`; `onLost` hears when it ends without `end()`. */
  static open(
    rpc: Rpc,
    clientName: string,
    providers: Providers,
    onLost: (session: Session) => void,
    timeoutMs: number,
  ): Promise<Session> {
    const stream: SessionStream = rpc.bidi(pb.SystemPromptService.method.openSession);
    const finished = new Deferred<void>();
    let session: Session | undefined;
    const start = create(pb.OpenSessionRequestSchema, {
      kind: {
        case: "start",
        value: { clientName, clientVersion: CLIENT_VERSION, features: [FEATURE_EACH_ANSWER, FEATURE_CALLBACK_CACHE] },
      },
    });
    return openCallbackStream(stream, start, timeoutMs, {
      doing: "opening the session",
      unconfirmed: "the session stream did not start with SessionOpened",
      endedEarly: "it ended the session stream before opening it",
      confirm: (first) => {
        if (first.kind.case !== "opened" || !first.kind.value.sessionId) return undefined;
        session = new Session(stream, first.kind.value, providers, finished.promise);
        return session;
      },
      receive: (message) => {
        if (session !== undefined) session.#receive(message);
      },
      ended: () => {
        finished.resolve();
        if (session !== undefined) session.#lost(onLost);
      },
    });
  }

  /** The stream is over, whoever ended it. */
  get ended(): boolean {
    return this.#ended;
  }

  /** End the stream (a half-close, its clean end): the sidecar disposes everything registered on it. */
  async end(): Promise<void> {
    if (this.#ending) return;
    this.#ending = true;
    this.#cancelAnswers();
    try {
      this.#stream.end();
    } catch {
      // over already
    }
    await within(this.#finished, END_WAIT_MS);
    this.#stream.cancel(); // a sidecar that never closed its side keeps no stream of ours
  }

  /**
   * Drop the sidecar's cached answers of the providers `providerKeys`; done once it
   * confirms, within `timeoutMs`. A sidecar without the feature caches nothing to drop.
   */
  async invalidate(providerKeys: string[], timeoutMs: number): Promise<void> {
    if (!this.#callbackCache || this.#ending || this.#ended) return;
    const send = (invalidate: pb.CacheInvalidate): void => {
      try {
        this.#stream.write(create(pb.OpenSessionRequestSchema, { kind: { case: "invalidate", value: invalidate } }));
      } catch {
        this.#invalidations.release(); // the session is over: its providers went with it
      }
    };
    await this.#invalidations.await(send, timeoutMs, providerKeys);
  }

  #receive(message: pb.OpenSessionResponse): void {
    const kind = message.kind;
    if (kind.case === "provide") {
      if (!this.#answering.has(kind.value.callId)) void this.#answer(kind.value); // else: a repeat, being answered
    } else if (kind.case === "cancel") {
      this.#answering.get(kind.value.callId)?.abort();
    } else if (kind.case === "ejected") {
      this.onEjected(kind.value);
    } else if (kind.case === "invalidated") {
      this.#invalidations.confirmed(kind.value.invalidateId);
    }
    // A second `opened`, and a kind this client does not know (a newer sidecar's),
    // are ignored: the first `opened` named the session.
  }

  #lost(onLost: (session: Session) => void): void {
    this.#ended = true;
    this.#invalidations.release(); // what it registered is gone, cached answers with it
    this.#cancelAnswers(); // nobody reads their answers any more
    if (!this.#ending) onLost(this);
  }

  async #answer(request: pb.ProvideRequest): Promise<void> {
    const controller = new AbortController();
    this.#answering.set(request.callId, controller);
    const provided = (values: pb.ProvidedValue[]) => this.#provided(request.callId, values, controller.signal);
    try {
      const answers = this.#providers.answers(request, controller.signal);
      if (this.#eachAnswer) {
        // Each value goes as it comes: a slow provider holds up (and blames) no other.
        await Promise.all(answers.map(async (answer) => provided([await answer])));
      } else {
        provided(await Promise.all(answers));
      }
    } finally {
      this.#answering.delete(request.callId);
    }
  }

  /** Send `values` as (part of) the answer to `callId`, unless the sidecar gave up on it. */
  #provided(callId: bigint, values: pb.ProvidedValue[], signal: AbortSignal): void {
    if (signal.aborted) return; // the sidecar gave up on this request: nobody reads the answer
    try {
      this.#stream.write(
        create(pb.OpenSessionRequestSchema, {
          kind: { case: "provided", value: { callId, values: fitted(values, this.#maxMessageBytes) } },
        }),
      );
    } catch {
      // the session is over: that assembly has failed already
    }
  }

  #cancelAnswers(): void {
    for (const controller of this.#answering.values()) controller.abort();
  }
}

const FRAMING_BYTES = 64; // the OpenSessionRequest and ProvideResponse around the values, with room to spare

/**
 * `values`, their largest replaced by their providers' errors (with `answerBytes`) while
 * together they are over what the sidecar reads, `limit` (0: not said): the assembly
 * fails naming them, and the session lives on.
 */
function fitted(values: pb.ProvidedValue[], limit: number): pb.ProvidedValue[] {
  if (limit <= 0) return values;
  const sizes = values.map((value) => toBinary(pb.ProvidedValueSchema, value).length + 6); // with its tag and length
  let total = sizes.reduce((sum, size) => sum + size, FRAMING_BYTES);
  if (total <= limit) return values;
  const out = [...values];
  const largest = sizes.map((_, index) => index).sort((a, b) => sizes[b]! - sizes[a]!);
  for (const index of largest) {
    if (total <= limit) break;
    const size = sizes[index]! - 6;
    const message = `its answer of ${size} bytes is over the sidecar's max_message_bytes`;
    out[index] = create(pb.ProvidedValueSchema, {
      providerKey: values[index]!.providerKey,
      value: { case: "error", value: { message, answerBytes: BigInt(size) } },
    });
    total -= sizes[index]! - toBinary(pb.ProvidedValueSchema, out[index]!).length;
  }
  return out;
}
