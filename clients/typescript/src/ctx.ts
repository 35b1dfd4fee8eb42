/**
 * The registry's original in-process API, `ctx.systemPrompt`, served by the sidecar.
 *
 * An agent written against the original plugin keeps its code: registrations
 * return a plain `() => void` disposer at once, and `assemble(context)` takes the
 * original `AssembleContext` (its `scope`, its `signal`, any other fields). The
 * registrations travel to the sidecar in the background, one after another in
 * the order they were made; an assembly
 * waits for every registration made before it, so it always sees them, and it
 * rejects with the first registration that failed since the last assembly (the
 * original throws at the call; over a wire, the next assembly is the first place
 * that can).
 *
 * ```ts
 * import { connect, systemPrompt } from "@dsh/system-prompt";
 * const ctx = { systemPrompt: systemPrompt(await connect()) };
 * const off = ctx.systemPrompt.section({ name: "rules", order: 10, text: "Be precise." });
 * const assembly = await ctx.systemPrompt.assemble({ scope: "agent-1", cwd: "/work" });
 * off();
 * ```
 */

import type { Client, Disposer, PromptContext, PromptSection, Scope, ToolsSource, VariableSource } from "./client.js";
import type { JsonObject, PromptAssembly } from "./types.js";

/** The original `AssembleContext`: a scope, a signal, and any fields of the caller's. */
export interface OriginalAssembleContext {
  scope?: string | undefined;
  signal?: AbortSignal | undefined;
  [field: string]: unknown;
}

/** `ctx.systemPrompt` as the original plugin shaped it. */
export interface SystemPromptService {
  section(section: PromptSection): () => void;
  context(context: PromptContext): () => void;
  suppressRuntimeContext(): () => void;
  tools(provider: ToolsSource): () => void;
  variable(name: string, provider: VariableSource): () => void;
  assemble(context?: OriginalAssembleContext): Promise<PromptAssembly>;
}

/**
 * The original API over a client (the global layer) or over a scope handle (that
 * scope's layer, like `agent.ctx`); `client` assembles, and defaults to `target`.
 */
export function systemPrompt(target: Client | Scope, client: Client = target as Client): SystemPromptService {
  if (typeof client.assemble !== "function") {
    throw new TypeError("systemPrompt(scope, client): a scope handle needs the client that assembles");
  }
  const backlog = new Backlog();
  const register = (start: () => Promise<Disposer>): (() => void) => {
    const registered = backlog.enqueue(start);
    return () => {
      void backlog.enqueue(async () => (await registered)?.());
    };
  };
  return {
    section: (section) => register(() => target.section(section)),
    context: (context) => register(() => target.context(context)),
    suppressRuntimeContext: () => register(() => target.suppressRuntimeContext()),
    tools: (provider) => register(() => target.tools(provider)),
    variable: (name, provider) => register(() => target.variable(name, provider)),
    async assemble(context: OriginalAssembleContext = {}): Promise<PromptAssembly> {
      await backlog.settled();
      const { scope, signal, ...fields } = context;
      return client.assemble({ scope, signal, fields: fields as JsonObject });
    },
  };
}

/** Calls made one after another in the background, and the first failure not yet reported. */
class Backlog {
  #last: Promise<unknown> = Promise.resolve();
  #failure: { error: unknown } | undefined;

  /** Run `call` after every call enqueued before it; its failure goes to `settled()`. */
  enqueue<T>(call: () => Promise<T>): Promise<T | undefined> {
    const done = this.#last.then(call).then(
      (value) => value,
      (error: unknown) => {
        this.#failure ??= { error };
        return undefined;
      },
    );
    this.#last = done;
    return done;
  }

  /** Every call enqueued so far has run; throws the first unreported failure. */
  async settled(): Promise<void> {
    await this.#last;
    const failure = this.#failure;
    this.#failure = undefined;
    if (failure !== undefined) throw failure.error;
  }
}
