/**
 * The opt-in local cache (`connect(address, { localCache: true })`): `assemble()` of a
 * scope whose plan the sidecar marks `cacheable` answers from a copy kept here,
 * without a call.
 *
 * An answer is kept under (scope, fields) with the registry revision it was taken
 * at, and served while no later revision is known. Later revisions come from this
 * client's own change stream (every change, of every scope) and from the replies to
 * this client's own registrations, updates and disposals (read-your-writes). While
 * the change stream is broken, and after a resync, nothing is served or kept: a
 * break may hide changes, and a restarted sidecar's revisions start again.
 */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { ChangeStream, WATCH_FEATURES } from "./changes.js";
import type { Rpc } from "./rpc.js";
import { ToolSchema, type PromptAssembly } from "./types.js";

const MAX_ENTRIES = 256; // (scope, fields) pairs; a revision change makes them all unservable

/** A converted assembly, as plain values: each answer is built afresh from it. */
interface Template {
  readonly revision: number;
  readonly sections: readonly (readonly [string, string])[];
  readonly contexts: readonly (readonly [string, string])[];
  readonly tools: readonly (readonly [string, string, string])[]; // name, description, parameters JSON
  readonly variables: readonly (readonly [string, string | undefined])[];
}

function templateOf(reply: pb.AssembleResponse): Template {
  const message = reply.assembly;
  return {
    revision: Number(reply.revision),
    sections: (message?.sections ?? []).map(({ name, text }) => [name, text] as const),
    contexts: (message?.contexts ?? []).map(({ name, text }) => [name, text] as const),
    tools: (message?.tools ?? []).map(({ name, description, parametersJson }) => [name, description, parametersJson] as const),
    variables: (message?.variables ?? []).map(({ name, value }) => [name, value] as const),
  };
}

/** A new assembly the caller may change freely (tools parse their JSON when read). */
function copyOf(template: Template): PromptAssembly {
  const variables: Record<string, string | undefined> = {};
  for (const [name, value] of template.variables) variables[name] = value;
  return {
    sections: template.sections.map(([name, text]) => ({ name, text })),
    contexts: template.contexts.map(([name, text]) => ({ name, text })),
    tools: template.tools.map(([name, description, json]) => ToolSchema.fromJson(name, description, json)),
    variables,
  };
}

/** What an answer is kept under: the scope and the fields' JSON, as sent. */
export function cacheKey(context: pb.AssembleContext): string {
  return `${context.scope}\u0000${context.fieldsJson}`;
}

/** Cacheable answers by (scope, fields), valid while their revision is the latest known. */
export class LocalCache {
  /** The latest revision this client knows of. */
  known = 0;
  /** Moves whenever what is known may have been lost. */
  epoch = 0;
  /** The change stream is subscribed. */
  live = false;
  readonly #entries = new Map<string, Template>();
  #changes: ChangeStream | undefined;
  #following: Promise<void> | undefined;

  /** A cache subscribed to every change; answers are kept from when it resolves. */
  static async open(rpc: Rpc, timeoutMs: number): Promise<LocalCache> {
    const cache = new LocalCache();
    const request = create(pb.WatchChangesRequestSchema, { features: WATCH_FEATURES });
    cache.#changes = await ChangeStream.open(rpc, request, timeoutMs, () => cache.#ended(), cache);
    cache.known = cache.#changes.revision;
    cache.live = true;
    cache.#following = cache.#follow(cache.#changes);
    return cache;
  }

  /** A copy of the kept answer for `key`, if it is still the registry's. */
  get(key: string): PromptAssembly | undefined {
    const entry = this.live ? this.#entries.get(key) : undefined;
    return entry === undefined || entry.revision < this.known ? undefined : copyOf(entry);
  }

  /** Keep `reply`, asked for at `epoch`, unless something was lost since. */
  put(epoch: number, key: string, reply: pb.AssembleResponse): void {
    if (!reply.cacheable || epoch !== this.epoch || !this.live) return;
    if (Number(reply.revision) < this.known) return; // a later change is known already
    if (this.#entries.size >= MAX_ENTRIES && !this.#entries.has(key)) this.#entries.clear();
    this.#entries.set(key, templateOf(reply));
  }

  /** This client changed the registry; its reply said `revision` (undefined or 0: not said). */
  wrote(revision: number | undefined): void {
    if (revision) this.known = Math.max(this.known, revision);
    else this.drop();
  }

  /** Forget every answer, and any answer asked for before now. */
  drop(): void {
    this.#entries.clear();
    this.epoch += 1;
  }

  /** The change stream broke: changes may pass unseen until it resumes. */
  broke(): void {
    this.live = false;
    this.drop();
  }

  /** The change stream is subscribed again (its replay, or a resync, follows). */
  resumed(): void {
    this.drop();
    this.known = this.#changes?.lastRevision ?? 0;
    this.live = true;
  }

  async close(): Promise<void> {
    this.#ended();
    this.#changes?.close();
    await this.#following;
  }

  #ended(): void {
    this.live = false;
    this.drop();
  }

  async #follow(changes: ChangeStream): Promise<void> {
    try {
      for await (const item of changes) {
        if (item.type === "resynced") this.drop(); // another incarnation's revisions, or a gap
        this.known = Math.max(this.known, changes.lastRevision);
      }
    } catch {
      // the stream ended with an error: the cache is off (#ended ran with the close)
    } finally {
      this.#ended();
    }
  }
}
