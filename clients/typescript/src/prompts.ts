/** Live prompts: `client.watchPrompt()` as an async iterator of PromptChange. */

import type { ClientReadableStream, ServiceError } from "@grpc/grpc-js";
import type * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import type { Closable } from "./closable.js";
import { assemblyFromProto, changeFromProto, reportFromProto } from "./convert.js";
import { errorFromGrpc } from "./errors.js";
import type { PromptChange } from "./types.js";

/**
 * `for await (const change of prompts)`: the prompt now, then after each burst of
 * changes. It ends when closed; a broken stream (a restart) rejects with a
 * SystemPromptError: watch again to continue.
 */
export class PromptStream implements AsyncIterableIterator<PromptChange>, Closable {
  readonly #call: ClientReadableStream<pb.WatchPromptResponse>;
  readonly #messages: AsyncIterator<pb.WatchPromptResponse>;
  readonly #onClose: (stream: PromptStream) => void;
  #closed = false;

  /** @internal Use `client.watchPrompt()`. */
  constructor(call: ClientReadableStream<pb.WatchPromptResponse>, onClose: (stream: PromptStream) => void) {
    this.#call = call;
    this.#messages = call[Symbol.asyncIterator]() as AsyncIterator<pb.WatchPromptResponse>;
    this.#onClose = onClose;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<PromptChange>> {
    let result: IteratorResult<pb.WatchPromptResponse>;
    try {
      result = await this.#messages.next();
    } catch (error) {
      if (this.#closed) return { done: true, value: undefined };
      this.close();
      throw errorFromGrpc(error as ServiceError);
    }
    if (this.#closed || result.done) {
      this.close();
      return { done: true, value: undefined };
    }
    return { done: false, value: promptChangeFromProto(result.value) };
  }

  /** Stop watching (also what `break` out of a `for await` does). */
  async return(): Promise<IteratorResult<PromptChange>> {
    this.close();
    return { done: true, value: undefined };
  }

  /** Stop watching. */
  close(): void {
    if (!this.#closed) {
      this.#closed = true;
      this.#onClose(this);
    }
    this.#call.cancel();
  }
}

export function promptChangeFromProto(message: pb.WatchPromptResponse): PromptChange {
  return {
    revision: Number(message.revision),
    incarnation: message.incarnation,
    assembly: message.assembly === undefined ? undefined : assemblyFromProto(message.assembly),
    prompt: message.rendered?.prompt,
    contextSnapshot: message.rendered?.contextSnapshot,
    report: message.report === undefined ? undefined : reportFromProto(message.report),
    changes: message.changes.map(changeFromProto),
    changesOmitted: Number(message.changesOmitted),
    error: message.error,
  };
}
