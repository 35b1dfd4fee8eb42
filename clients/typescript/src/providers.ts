/**
 * Dynamic providers: the functions this client registered, and answering the
 * sidecar's ProvideRequests with their values. Providers stay here across
 * reconnects under the key the sidecar quotes back, so a replayed registration
 * finds its provider again.
 */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { contextFromProto, toolsToProto } from "./convert.js";
import type { AssembleContext } from "./types.js";

/** A dynamic provider, evaluated in this process at every assembly that needs it. */
export type Provider = (context: AssembleContext) => unknown;

/** The dynamic providers of this client, by the key the sidecar asks for. */
export class Providers {
  readonly #providers = new Map<string, Provider>();
  #keys = 0;

  /** Keep `provider` here; the returned key is what the sidecar asks for. */
  add(provider: Provider): string {
    this.#keys += 1;
    const key = `p${this.#keys}`;
    this.#providers.set(key, provider);
    return key;
  }

  remove(key: string | undefined): void {
    if (key !== undefined) this.#providers.delete(key);
  }

  /**
   * The value of every call `request` asks for, each a promise of its own that settles
   * as soon as its provider returns; a provider's failure is its answer, not this client's.
   */
  answers(request: pb.ProvideRequest, signal: AbortSignal): Promise<pb.ProvidedValue>[] {
    let context: AssembleContext;
    try {
      context = contextFromProto(request.context, signal);
    } catch (error) {
      // Fields that are not JSON: no provider can answer.
      return request.calls.map((call) => Promise.resolve(failed(call.providerKey, error)));
    }
    return request.calls.map((call) => this.#value(call, context));
  }

  async #value(call: pb.ProvideCall, context: AssembleContext): Promise<pb.ProvidedValue> {
    try {
      const provider = this.#providers.get(call.providerKey);
      if (provider === undefined) throw new ReferenceError("the provider was disposed in this client");
      const value: pb.ProvidedValue["value"] = fill(call.kind, await provider(context));
      return create(pb.ProvidedValueSchema, { providerKey: call.providerKey, value });
    } catch (error) {
      return failed(call.providerKey, error); // the provider's failure fails the assembly, not this client
    }
  }
}

function failed(providerKey: string, error: unknown): pb.ProvidedValue {
  return create(pb.ProvidedValueSchema, {
    providerKey,
    value: { case: "error", value: { message: describe(error) } },
  });
}

const TEXT_KINDS = new Set<number>([pb.ProviderKind.SECTION, pb.ProviderKind.CONTEXT]);

function fill(kind: pb.ProviderKind, value: unknown): pb.ProvidedValue["value"] {
  if (kind === pb.ProviderKind.TOOLS) {
    return { case: "tools", value: toolsToProto(value as Parameters<typeof toolsToProto>[0]) };
  }
  if (kind === pb.ProviderKind.VARIABLE) {
    if (value === undefined || value === null) return { case: "noValue", value: create(pb.NoValueSchema) };
    if (typeof value === "string") return { case: "variableValue", value };
    throw new TypeError(`a variable provider must return a string or undefined, not ${String(value)}`);
  }
  // A newer sidecar's kind: say so rather than guess.
  if (!TEXT_KINDS.has(kind)) throw new TypeError(`this client does not know provider kind ${kind}`);
  if (typeof value === "string") return { case: "text", value };
  throw new TypeError(`a text provider must return a string, not ${String(value)}`);
}

/** What a failing provider or listener said, as `Name: message`. */
export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : `Error: ${String(error)}`;
}
