/** The change-event stream as an async iterator. */

import type { ClientReadableStream, ServiceError } from "@grpc/grpc-js";
import type * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { changeFromProto } from "./convert.js";
import { Code, Reason, SystemPromptError, errorFromGrpc } from "./errors.js";
import type { ChangeEvent, ChangesMissed } from "./types.js";

/** `for await (const change of changes)`: a ChangeEvent, or ChangesMissed after a gap. */
export class ChangeStream implements AsyncIterableIterator<ChangeEvent | ChangesMissed> {
  /** The registry's revision when the subscription started. */
  readonly revision: number;
  readonly #call: ClientReadableStream<pb.WatchChangesResponse>;
  readonly #messages: AsyncIterator<pb.WatchChangesResponse>;

  private constructor(
    call: ClientReadableStream<pb.WatchChangesResponse>,
    messages: AsyncIterator<pb.WatchChangesResponse>,
    revision: number,
  ) {
    this.#call = call;
    this.#messages = messages;
    this.revision = revision;
  }

  /** Subscribe on `call`; resolves once the sidecar confirmed the subscription. */
  static async open(call: ClientReadableStream<pb.WatchChangesResponse>): Promise<ChangeStream> {
    const messages = call[Symbol.asyncIterator]() as AsyncIterator<pb.WatchChangesResponse>;
    let first: IteratorResult<pb.WatchChangesResponse>;
    try {
      first = await messages.next();
    } catch (error) {
      throw errorFromGrpc(error as ServiceError);
    }
    if (first.done || first.value.kind.case !== "subscribed") {
      call.cancel();
      throw new SystemPromptError("the sidecar closed the change stream", Code.UNAVAILABLE, Reason.SIDECAR_UNAVAILABLE);
    }
    return new ChangeStream(call, messages, Number(first.value.kind.value.revision));
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<ChangeEvent | ChangesMissed>> {
    for (;;) {
      let result: IteratorResult<pb.WatchChangesResponse>;
      try {
        result = await this.#messages.next();
      } catch (error) {
        if ((error as ServiceError).code === Code.CANCELLED) return { done: true, value: undefined };
        throw errorFromGrpc(error as ServiceError);
      }
      if (result.done) return { done: true, value: undefined };
      const kind = result.value.kind;
      if (kind.case === "event") return { done: false, value: changeFromProto(kind.value) };
      if (kind.case === "missed") {
        const missed = kind.value;
        return {
          done: false,
          value: {
            type: "missed",
            firstRevision: Number(missed.firstMissedRevision),
            count: Number(missed.count),
            resyncRevision: Number(missed.resyncRevision),
          },
        };
      }
    }
  }

  /** Stop watching (also what `break` out of a `for await` does). */
  async return(): Promise<IteratorResult<ChangeEvent | ChangesMissed>> {
    this.close();
    return { done: true, value: undefined };
  }

  /** Stop watching. */
  close(): void {
    this.#call.cancel();
  }
}
