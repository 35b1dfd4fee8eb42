/** Small promise tools: a deferred, bounded confirmations, and waits that leave no timer behind. */

/** A promise with its resolve and reject at hand. */
export class Deferred<T> {
  readonly promise: Promise<T>;
  resolve!: (value: T) => void;
  reject!: (error: Error) => void;

  constructor() {
    this.promise = new Promise<T>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
  }
}

/** Resolves after `ms`, or at once when `signal` aborts; reports which. */
export function pause(ms: number, signal?: AbortSignal): Promise<"elapsed" | "aborted"> {
  if (signal?.aborted) return Promise.resolve("aborted");
  return new Promise((resolve) => {
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve("aborted");
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve("elapsed");
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** `promise`'s outcome, or `"timeout"` after `ms` (undefined: no limit); the timer is cleared either way. */
export async function within<T>(promise: Promise<T>, ms: number | undefined): Promise<T | "timeout"> {
  if (ms === undefined || !Number.isFinite(ms)) return promise;
  let timer: NodeJS.Timeout | undefined;
  const elapsed = new Promise<"timeout">((resolve) => {
    timer = setTimeout(() => resolve("timeout"), Math.max(0, ms));
  });
  try {
    return await Promise.race([promise, elapsed]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A stream's confirmation (its first answer): settled once, by the answer, a failure,
 * or `onTimeout` after `timeoutMs`, whose timer goes with it.
 */
export class Confirmation<T> {
  readonly promise: Promise<T>;
  readonly #deferred = new Deferred<T>();
  readonly #timer: NodeJS.Timeout;
  #settled = false;

  constructor(timeoutMs: number, onTimeout: () => Error) {
    this.promise = this.#deferred.promise;
    this.#timer = setTimeout(() => this.fail(onTimeout()), timeoutMs);
  }

  get settled(): boolean {
    return this.#settled;
  }

  confirm(value: T): void {
    if (this.#settle()) this.#deferred.resolve(value);
  }

  fail(error: Error): void {
    if (this.#settle()) this.#deferred.reject(error);
  }

  #settle(): boolean {
    const first = !this.#settled;
    this.#settled = true;
    clearTimeout(this.#timer);
    return first;
  }
}
