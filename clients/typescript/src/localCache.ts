/**
 * The opt-in local cache (`connect(address, { localCache: true })`): `assemble()` of a
 * scope whose plan the sidecar marks `cacheable` (all-static) or `cacheableWithFields`
 * (its only non-static steps are rules) answers from a copy kept here, without a call.
 *
 * A static plan's answer is kept under its scope alone (it ignores the fields, as the
 * sidecar's own kept answers do); a rules-only plan's under its scope and the request's
 * very `fieldsJson` (a rule reads only the assembly, the fields and the scope). Each is
 * kept with what it read: the layers of its scope chain
 * (`AssembleResponse.scopeChain`, the asked key and the global layer) and their
 * revision (`cacheRevision`). It is served until a change event of one of those layers
 * comes with a later revision, or one that re-bound a scope key of its chain (the
 * event's `reboundScopes`: a key that got a parent, or lost it when nothing held it any
 * more), or one the sidecar marks `global` (the global layer's, or a listener or rule
 * that runs everywhere), so a change in another scope, a step registered on another
 * scope among them, leaves it in place. From a sidecar that does not say `global`, any
 * listener or rule event counts (one registered with `global` runs everywhere, and it
 * cannot tell). A sidecar that sends no `cacheRevision` is one where every change counts.
 *
 * Changes come from a change stream: one of every change when the credential may
 * watch every layer, else (PERMISSION_DENIED: an agent that lists its own scopes) one
 * per scope assembled, filtered to that scope's chain, at most MAX_SCOPE_WATCHES. The
 * replies to this client's own registrations, updates and disposals count too
 * (read-your-writes). While a stream is broken, and after a resync or a gap, nothing
 * it covers is served or kept.
 *
 * What is kept is bounded by `localCacheBytes` (its texts counted, two bytes a UTF-16
 * unit) and by MAX_ENTRIES, the least recently used dropped first.
 */

import { create } from "@bufbuild/protobuf";
import * as pb from "./gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { ChangeStream, WATCH_FEATURES } from "./changes.js";
import { Code, SystemPromptError } from "./errors.js";
import type { Rpc } from "./rpc.js";
import { ToolSchema, type ChangeEvent, type PromptAssembly } from "./types.js";

/** `connect({ localCacheBytes })`'s default: 32 MiB. */
export const LOCAL_CACHE_BYTES = 32 * 1024 * 1024;
const MAX_ENTRIES = 256; // answers kept (a scope's, or a scope's for some fields)
const MAX_SCOPE_WATCHES = 16; // change streams of one scope each, for a credential listing scopes
const RECENT = 1024; // change events remembered for answers in flight while they came
const REFUSED = 1024; // scopes whose watch was refused, not asked again (then forgotten)
const STEP_KINDS = new Set(["listener", "rule"]); // an older sidecar does not say `global`: these may run everywhere

/** A converted assembly, as plain values: each answer is built afresh from it. */
interface Template {
  /** Of what it read (cacheRevision; an older sidecar's: the registry's revision). */
  readonly revision: number;
  /** The scope keys it read; undefined: every change concerns it. */
  readonly reads: ReadonlySet<string> | undefined;
  readonly watch: Watch;
  readonly size: number;
  readonly sections: readonly (readonly [string, string])[];
  readonly contexts: readonly (readonly [string, string])[];
  readonly tools: readonly (readonly [string, string, string])[]; // name, description, parameters JSON
  readonly variables: readonly (readonly [string, string | undefined])[];
}

/** The scope keys a change concerns; undefined: every one. */
type Layers = readonly string[] | undefined;

/** Whether a change of `layers` (undefined: every layer) at `revision` makes `entry` stale. */
function concerned(entry: Template, layers: Layers, revision: number): boolean {
  if (revision <= entry.revision) return false; // it is in the answer already
  const reads = entry.reads;
  return layers === undefined || reads === undefined || layers.some((layer) => reads.has(layer));
}

/** What an answer is kept under: its scope, and the request's fieldsJson for a rules-only
 * plan's (null: a static plan's, the same for any fields). */
function keyOf(scope: string, fieldsJson: string | null): string {
  return JSON.stringify([scope, fieldsJson]);
}

function templateOf(reply: pb.AssembleResponse, scope: string, fieldsJson: string | null, watch: Watch): Template {
  const message = reply.assembly;
  const sections = (message?.sections ?? []).map(({ name, text }) => [name, text] as const);
  const contexts = (message?.contexts ?? []).map(({ name, text }) => [name, text] as const);
  const tools = (message?.tools ?? []).map(
    ({ name, description, parametersJson }) => [name, description, parametersJson] as const,
  );
  const variables = (message?.variables ?? []).map(({ name, value }) => [name, value] as const);
  let units = scope.length + (fieldsJson?.length ?? 0);
  for (const part of [...sections, ...contexts, ...tools]) for (const text of part) units += text.length;
  for (const [name, value] of variables) units += name.length + (value?.length ?? 0);
  const cacheRevision = Number(reply.cacheRevision);
  return {
    revision: cacheRevision || Number(reply.revision),
    reads: cacheRevision ? new Set([scope, ...reply.scopeChain]) : undefined,
    watch,
    size: 2 * units,
    sections,
    contexts,
    tools,
    variables,
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

/** Taken before an Assemble call: what its answer is kept against. */
export interface Ticket {
  readonly epoch: number;
  readonly watch: Watch;
  readonly watchEpoch: number;
  readonly sequence: number;
}

/** One change stream the cache follows: of every layer (`scope` undefined), or of one scope's chain. */
class Watch {
  live = false;
  epoch = 0;
  #changes: ChangeStream | undefined;
  #following: Promise<void> | undefined;

  constructor(
    readonly cache: LocalCache,
    readonly scope: string | undefined,
  ) {}

  async start(rpc: Rpc, timeoutMs: number): Promise<void> {
    const request = create(pb.WatchChangesRequestSchema, { features: WATCH_FEATURES });
    if (this.scope !== undefined) request.filter = create(pb.ChangeFilterSchema, { scope: this.scope, ancestors: true });
    this.#changes = await ChangeStream.open(rpc, request, timeoutMs, () => this.#ended(), this);
    this.live = true;
    this.#following = this.#follow(this.#changes);
  }

  /** The stream broke: changes may pass unseen until it resumes. */
  broke(): void {
    this.live = false;
    this.lost();
  }

  /** Subscribed again (its replay, or a resync, follows). */
  resumed(): void {
    this.lost();
    this.live = true;
  }

  lost(): void {
    this.epoch += 1;
    this.cache.lost(this);
  }

  async close(): Promise<void> {
    this.live = false;
    this.#changes?.close();
    await this.#following;
  }

  #ended(): void {
    this.live = false;
    this.lost();
    this.cache.ended(this);
  }

  async #follow(changes: ChangeStream): Promise<void> {
    try {
      for await (const item of changes) {
        if (item.type === "change") this.cache.changed(item);
        else this.lost(); // a resync (another incarnation's revisions) or a gap
      }
    } catch (error) {
      if (error instanceof SystemPromptError && error.code === Code.PERMISSION_DENIED && this.scope !== undefined) {
        this.cache.refused(this.scope);
      }
    } finally {
      this.#ended();
    }
  }
}

/** Cacheable answers by scope (and fields, for a rules-only plan), each valid until a layer
 * it read changes. */
export class LocalCache {
  /** Moves whenever every answer is dropped. */
  epoch = 0;
  live = false;
  /** What the kept answers' texts take. */
  bytes = 0;
  /** Assemblies answered here, without a call, and those asked of the sidecar. */
  answered = 0;
  asked = 0;
  readonly #entries = new Map<string, Template>(); // by keyOf, in use order, the least recent first
  #every: Watch | undefined;
  readonly #scoped = new Map<string, Watch>();
  readonly #refused = new Set<string>();
  readonly #recent: (readonly [number, number, Layers])[] = []; // sequence, revision, layers
  #sequence = 0;

  private constructor(
    readonly rpc: Rpc,
    readonly timeoutMs: number,
    readonly maxBytes: number,
  ) {}

  /** A cache subscribed to every change, or ready to watch each scope assembled when the
   * credential may not watch every layer; answers are kept from when it resolves. */
  static async open(rpc: Rpc, timeoutMs: number, maxBytes = LOCAL_CACHE_BYTES): Promise<LocalCache> {
    const cache = new LocalCache(rpc, timeoutMs, maxBytes);
    const watch = new Watch(cache, undefined);
    try {
      await watch.start(rpc, timeoutMs);
      cache.#every = watch;
    } catch (error) {
      if (!(error instanceof SystemPromptError && error.code === Code.PERMISSION_DENIED)) throw error;
    }
    cache.live = true;
    return cache;
  }

  /** What an answer for `scope` asked for now is kept against; undefined: it is not kept
   * (no stream covers the scope yet: one is opened for the next). */
  ticket(scope: string): Ticket | undefined {
    this.asked += 1;
    const watch = this.live ? this.#watchOf(scope) : undefined;
    if (watch === undefined || !watch.live) return undefined;
    return { epoch: this.epoch, watch, watchEpoch: watch.epoch, sequence: this.#sequence };
  }

  /** A copy of the kept answer for `scope` (a static plan's) or for `scope` with these very
   * `fieldsJson` (a rules-only plan's), if it is still the registry's. */
  get(scope: string, fieldsJson: string): PromptAssembly | undefined {
    if (!this.live) return undefined;
    for (const key of [keyOf(scope, null), keyOf(scope, fieldsJson)]) {
      const entry = this.#entries.get(key);
      if (entry === undefined || !entry.watch.live) continue;
      this.#entries.delete(key);
      this.#entries.set(key, entry); // the most recently used
      this.answered += 1;
      return copyOf(entry);
    }
    return undefined;
  }

  /** Keep `reply`, asked for with `ticket`, unless something was lost since: under `scope`
   * when it is `cacheable`, under `scope` and `fieldsJson` when it is `cacheableWithFields`;
   * else not at all. */
  put(ticket: Ticket | undefined, scope: string, fieldsJson: string, reply: pb.AssembleResponse): void {
    const fields = reply.cacheable ? null : reply.cacheableWithFields ? fieldsJson : undefined;
    if (ticket === undefined || fields === undefined || ticket.epoch !== this.epoch) return;
    const watch = ticket.watch;
    if (!watch.live || ticket.watchEpoch !== watch.epoch) return;
    const entry = templateOf(reply, scope, fields, watch);
    if (entry.size > this.maxBytes || this.#overtaken(entry, ticket.sequence)) return;
    const key = keyOf(scope, fields);
    this.#drop(key);
    this.#entries.set(key, entry);
    this.bytes += entry.size;
    while (this.bytes > this.maxBytes || this.#entries.size > MAX_ENTRIES) {
      const oldest = this.#entries.keys().next();
      if (oldest.done === true) break;
      this.#drop(oldest.value);
    }
  }

  /** A change event: the answers that read its layer, or a key it re-bound, go. */
  changed(event: ChangeEvent): void {
    const everywhere = !event.scope || (event.global ?? STEP_KINDS.has(event.kind));
    const layers = [event.scope ?? "", ...(event.reboundScopes ?? [])];
    this.#seen(everywhere ? undefined : layers, event.revision);
  }

  /** This client changed the registry; its reply said `revision` (undefined or 0: not said). */
  wrote(revision: number | undefined): void {
    if (revision) this.#seen(undefined, revision); // its layer unknown here: any
    else this.drop();
  }

  /** Forget every answer, and any answer asked for before now. */
  drop(): void {
    this.#entries.clear();
    this.bytes = 0;
    this.epoch += 1;
  }

  /** `watch` may have missed changes: what it covers goes. */
  lost(watch: Watch): void {
    for (const [key, entry] of [...this.#entries]) if (entry.watch === watch) this.#drop(key);
  }

  refused(scope: string): void {
    if (this.#refused.size >= REFUSED) this.#refused.clear();
    this.#refused.add(scope);
  }

  /** `watch` ended for good: a scope's may be opened again later. */
  ended(watch: Watch): void {
    if (watch.scope !== undefined && this.#scoped.get(watch.scope) === watch) this.#scoped.delete(watch.scope);
  }

  async close(): Promise<void> {
    this.live = false;
    const watches = [...this.#scoped.values(), ...(this.#every ? [this.#every] : [])];
    this.#scoped.clear();
    await Promise.all(watches.map((watch) => watch.close()));
    this.drop();
  }

  /** The stream covering `scope`: the one of every change, else the scope's own, opened in
   * the background the first time (none for the global layer alone, past
   * MAX_SCOPE_WATCHES, or where the watch was refused). */
  #watchOf(scope: string): Watch | undefined {
    if (this.#every !== undefined) return this.#every;
    const watch = this.#scoped.get(scope);
    if (watch !== undefined || scope === "" || this.#refused.has(scope)) return watch;
    if (this.#scoped.size >= MAX_SCOPE_WATCHES) return undefined;
    const opened = new Watch(this, scope);
    this.#scoped.set(scope, opened);
    opened.start(this.rpc, this.timeoutMs).catch((error: unknown) => {
      if (error instanceof SystemPromptError && error.code === Code.PERMISSION_DENIED) this.refused(scope);
      this.ended(opened);
    });
    return opened;
  }

  #seen(layers: Layers, revision: number): void {
    this.#sequence += 1;
    this.#recent.push([this.#sequence, revision, layers]);
    if (this.#recent.length > RECENT) this.#recent.shift();
    for (const [key, entry] of [...this.#entries]) if (concerned(entry, layers, revision)) this.#drop(key);
  }

  /** Whether a change seen since `sequence` (while the answer was on its way) makes `entry`
   * stale, or too many came to tell. */
  #overtaken(entry: Template, sequence: number): boolean {
    if (this.#sequence === sequence) return false;
    const first = this.#recent[0];
    if (first === undefined || first[0] > sequence + 1) return true; // some have been forgotten
    return this.#recent.some(([seen, revision, layers]) => seen > sequence && concerned(entry, layers, revision));
  }

  #drop(key: string): void {
    const entry = this.#entries.get(key);
    if (entry === undefined) return;
    this.#entries.delete(key);
    this.bytes -= entry.size;
  }
}
