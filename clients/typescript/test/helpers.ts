/** What the tests share: the built-in sections, and small readers of assemblies. */

import { after, afterEach, before } from "node:test";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import { Sidecar, type SidecarOptions } from "./sidecar.js";
import type { PromptAssembly } from "../src/index.js";

export const IDENTITY = "You are an AI agent powered by DeepSeek Harness.";
export const BUILTIN_SECTIONS = ["harness:identity", "deployment:persona"];

/** The sections' names, in prompt order. */
export function sectionNames(assembly: PromptAssembly): string[] {
  return assembly.sections.map((section) => section.name);
}

/** The sections' names without the sidecar's built-ins. */
export function ownSections(assembly: PromptAssembly): string[] {
  return sectionNames(assembly).filter((name) => !BUILTIN_SECTIONS.includes(name));
}

/** The tools' names, in model order. */
export function toolNames(assembly: PromptAssembly): string[] {
  return assembly.tools.map((tool) => tool.name);
}

/** One sidecar for a test file, and clients that are closed after each test. */
export interface Harness {
  readonly sidecar: Sidecar;
  /** A client of the file's sidecar, closed after the test. */
  connect(options?: dsp.ConnectOptions): Promise<dsp.Client>;
}

/** Start a sidecar before the file's tests and stop it after them. */
export function useSidecar(options: SidecarOptions = {}): Harness {
  let sidecar: Sidecar | undefined;
  const clients: dsp.Client[] = [];
  before(async () => {
    sidecar = await Sidecar.start(options);
  });
  afterEach(async () => {
    await Promise.all(clients.splice(0).map((client) => client.close()));
  });
  after(async () => {
    await sidecar?.stop();
  });
  return {
    get sidecar(): Sidecar {
      if (sidecar === undefined) throw new Error("the sidecar is not started yet");
      return sidecar;
    },
    async connect(connectOptions?: dsp.ConnectOptions): Promise<dsp.Client> {
      const client = await dsp.connect(this.sidecar.address, connectOptions);
      clients.push(client);
      return client;
    },
  };
}

/** Resolve once `condition()` holds, checking every few milliseconds; fail after `timeoutMs`. */
export async function waitFor(condition: () => boolean, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Resolve once `check()` resolves true, asking every few milliseconds; fail after `timeoutMs`. */
export async function eventually(check: () => Promise<boolean>, what: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** An interceptor counting the Assemble calls made (a locally kept answer makes none). */
export function assembleCounter(): { interceptor: grpc.Interceptor; count: () => number } {
  let calls = 0;
  const interceptor: grpc.Interceptor = (options, nextCall) => {
    if (options.method_definition.path.endsWith("/Assemble")) calls += 1;
    return new grpc.InterceptingCall(nextCall(options));
  };
  return { interceptor, count: () => calls };
}

/** Run `body` on a sidecar of its own with an owner client, a caching one (its local cache on)
 * and `restart`: the sidecar stopped, another started at its address, both clients reconnected. */
export async function acrossARestart(
  body: (owner: dsp.Client, caching: dsp.Client, restart: () => Promise<void>) => Promise<void>,
): Promise<void> {
  let sidecar = await Sidecar.start();
  const address = sidecar.address;
  const owner = await dsp.connect(address);
  const caching = await dsp.connect(address, { localCache: true });
  const restart = async (): Promise<void> => {
    await sidecar.stop();
    sidecar = await Sidecar.restartAt(address);
    await eventually(async () => owner.connected && caching.connected, "both clients reconnect");
  };
  try {
    await body(owner, caching, restart);
  } finally {
    await caching.close();
    await owner.close();
    await sidecar.stop();
  }
}

/** The rejection of `promise`, which must be a SystemPromptError. */
export async function failure(promise: Promise<unknown>): Promise<dsp.SystemPromptError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof dsp.SystemPromptError) return error;
    throw error;
  }
  throw new Error("expected a SystemPromptError, but the call succeeded");
}

/** The SystemPromptError `promise` rejects with within `ms` (a hang fails the test). */
export async function bounded(promise: Promise<unknown>, ms = 5_000): Promise<dsp.SystemPromptError> {
  let timer: NodeJS.Timeout | undefined;
  const hang = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms: the client hangs`)), ms);
  });
  try {
    return await Promise.race([failure(promise), hang]);
  } finally {
    clearTimeout(timer);
  }
}
