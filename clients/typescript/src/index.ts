/**
 * @dsh/system-prompt: the TypeScript client of the dsh-system-prompt sidecar.
 *
 * ```ts
 * import * as dsp from "@dsh/system-prompt";
 * const client = await dsp.connect("127.0.0.1:50051");
 * await client.section("rules", 10, "Be precise.");
 * console.log(dsp.renderPrompt(await client.assemble()));
 * await client.close();
 * ```
 */

export {
  anthropicMessages,
  gemini,
  openaiChat,
  openaiResponses,
  renderedOf,
  toolParameters,
  type AdaptedPrompt,
  type AdapterOptions,
  type ProviderMessage,
  type ProviderRequest,
} from "./adapters.js";
export { usageFrom, type Usage } from "./cacheHistory.js";
export { Cache } from "./callbackCache.js";
export { ChangeStream, type ChangeItem } from "./changes.js";
export {
  Client,
  connect,
  DEFAULT_ADDRESS,
  defaultAddress,
  Scope,
  type AssembleOptions,
  type ConnectOptions,
  type Disposer,
  type Handle,
  type ListenerHandle,
  type WatchOptions,
  type CallbackOptions,
  type ListenerOptions,
  type PromptContext,
  type PromptSection,
  type SectionOptions,
  type TextSource,
  type ToolsSource,
  type VariableSource,
} from "./client.js";
export { systemPrompt, type OriginalAssembleContext, type SystemPromptService } from "./ctx.js";
export { Code, Reason, RenderError, SystemPromptError } from "./errors.js";
export type { Listener, NextFn } from "./listeners.js";
export { PromptStream } from "./prompts.js";
export { CONTEXT_SNAPSHOT_HEADER, renderContextSnapshot, renderPrompt } from "./render.js";
export { Mutation, type Rule, type RuleOptions, type RulePart } from "./rules.js";
export type { Pem, TlsOptions } from "./rpc.js";
export type { FilterOptions } from "./snapshots.js";
export * from "./types.js";
