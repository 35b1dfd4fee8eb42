/**
 * Cacheable callbacks on this client's side: the policy a provider or listener declares
 * (`cache`), and the cache invalidations awaiting the sidecar's confirmation on a stream.
 */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { Deferred, within } from "./async.js";
import { invalid, NoAnswer } from "./errors.js";

/** The feature offered on the session and every listener stream: this client sends CacheInvalidate. */
export const FEATURE_CALLBACK_CACHE = "callback-cache";

/**
 * What a provider's answer (or a listener's result, for its input) depends on, so that the
 * sidecar may reuse it instead of asking (docs/protocol.md, "Cacheable callbacks"):
 * `Cache.REVISION`, nothing but the registry's revision; `Cache.FIELDS`, the assemble
 * context too (its scope and fields); `Cache.ttl(s)`, either, reused for at most `s`
 * seconds. Any registry change drops every cached answer, and `await handle.invalidate()`
 * the callback's own. Without `cache`, a callback is asked at every assembly.
 */
export interface Cache {
  /** The answer depends on the assemble context too: one is kept per scope and fields. */
  readonly fields: boolean;
  /** Reused for at most this many seconds from when it was given; undefined: no limit. */
  readonly ttlS?: number | undefined;
}

/** The cache policies: `{ cache: Cache.REVISION }`, `Cache.FIELDS`, `Cache.ttl(30, { fields: true })`. */
export const Cache = Object.freeze({
  /** One answer per revision of the registry. */
  REVISION: Object.freeze({ fields: false }) as Cache,
  /** One answer per revision and assemble context. */
  FIELDS: Object.freeze({ fields: true }) as Cache,
  /** Reused for at most `seconds` (positive), and with `fields` kept per assemble context. */
  ttl(seconds: number, options: { fields?: boolean | undefined } = {}): Cache {
    const ttlS: unknown = seconds;
    if (typeof ttlS !== "number" || !Number.isFinite(ttlS) || ttlS <= 0) {
      throw invalid(`a time to live must be a positive number of seconds, not ${String(ttlS)}`);
    }
    return Object.freeze({ fields: options.fields ?? false, ttlS });
  },
});

/** A callback's cache policy as sent; undefined (asked every time) when not given. */
export function cachePolicyOf(cache: Cache | undefined): pb.CachePolicy | undefined {
  if (cache === undefined) return undefined;
  // a caller without the types may pass anything: only a Cache's shape is a policy
  const { fields, ttlS } = (cache ?? {}) as { fields?: unknown; ttlS?: unknown };
  const timed = typeof ttlS === "number" && Number.isFinite(ttlS) && ttlS > 0;
  if (typeof fields !== "boolean" || (ttlS !== undefined && !timed)) {
    const given = String(JSON.stringify(cache));
    throw invalid(`cache must be Cache.REVISION, Cache.FIELDS or Cache.ttl(seconds), not ${given}`);
  }
  return create(pb.CachePolicySchema, {
    dependsOn: fields ? pb.CacheDependency.CONTEXT : pb.CacheDependency.REVISION,
    ttlS: timed ? ttlS : 0,
  });
}

/** The CacheInvalidates sent on one stream that the sidecar has not confirmed yet. */
export class Invalidations {
  #last = 0n;
  readonly #waiting = new Map<bigint, Deferred<void>>();
  #over = false;

  /**
   * Send one invalidation (`send`, with its id) and wait until the sidecar confirms it or
   * the stream ends (then nothing it registered is cached any more); past `timeoutMs` it
   * is no answer (UNAVAILABLE / SIDECAR_UNAVAILABLE).
   */
  async await(
    send: (invalidate: pb.CacheInvalidate) => void,
    timeoutMs: number,
    providerKeys: string[] = [],
  ): Promise<void> {
    if (this.#over) return;
    this.#last += 1n;
    const invalidateId = this.#last;
    const done = new Deferred<void>();
    this.#waiting.set(invalidateId, done);
    try {
      send(create(pb.CacheInvalidateSchema, { invalidateId, providerKeys }));
      if ((await within(done.promise, timeoutMs)) === "timeout") throw new NoAnswer("a cache invalidation", timeoutMs);
    } finally {
      this.#waiting.delete(invalidateId);
    }
  }

  /** The sidecar's CacheInvalidated for `invalidateId`. */
  confirmed(invalidateId: bigint): void {
    this.#waiting.get(invalidateId)?.resolve();
  }

  /** The stream ended: what it registered is disposed, so every invalidation waiting is done. */
  release(): void {
    this.#over = true;
    for (const done of this.#waiting.values()) done.resolve();
  }
}
