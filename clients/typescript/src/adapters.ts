/**
 * Provider adapters: an assembly as the parameters of one model call, plain JSON values.
 *
 * ```ts
 * const rendered = await client.render({ report: true, reportKey: "conv-7" });
 * const request = dsp.anthropicMessages(rendered, messages, { reportKey: "conv-7" });
 * const response = await anthropic.messages.create({ model, max_tokens: 1024, ...request.params });
 * await client.reportUsage(response.usage, request.report);
 * ```
 *
 * Each keeps the assembly's tool order, parses each schema from the JSON text the sidecar
 * sent (keys in its order; JavaScript alone puts array-index keys such as "0" first), turns
 * `{}` into `{"type":"object"}` (each of these APIs wants an object schema), and puts the
 * runtime-context snapshot after the messages, past every cached part. No SDK is imported.
 */

import { renderContextSnapshot, renderPrompt } from "./render.js";
import { invalid } from "./errors.js";
import type { JsonObject, PromptAssembly, RenderedPrompt, ToolSchemaLike } from "./types.js";
import { ToolSchema } from "./types.js";

/** What an adapter takes: the sidecar's rendering, or an assembly rendered here. */
export type AdaptedPrompt = RenderedPrompt | PromptAssembly;

/** A message in the provider's own format, passed through as it is. */
export type ProviderMessage = JsonObject;

/** Options every provider adapter takes. */
export interface AdapterOptions {
  /** Each tool's `strict` (OpenAI: always sent, false by default; Anthropic: sent when true). */
  strict?: boolean | undefined;
  /** Where the call's usage is to be reported: the scope and key the assembly was rendered with. */
  scope?: string | undefined;
  reportKey?: string | undefined;
}

/** One model call's parameters, and where its usage goes: `client.reportUsage(usage, request.report)`. */
export interface ProviderRequest<P extends JsonObject = JsonObject> {
  params: P;
  report: { scope?: string | undefined; reportKey?: string | undefined };
}

/** The prompt text and the runtime-context snapshot (rendered here for an assembly). */
export function renderedOf(prompt: AdaptedPrompt): { prompt: string; contextSnapshot: string } {
  if ("assembly" in prompt) return { prompt: prompt.prompt, contextSnapshot: prompt.contextSnapshot };
  return { prompt: renderPrompt(prompt), contextSnapshot: renderContextSnapshot(prompt) };
}

function toolsOf(prompt: AdaptedPrompt): ToolSchemaLike[] {
  return "assembly" in prompt ? prompt.assembly.tools : prompt.tools;
}

/** A tool's JSON Schema as a new object, keys in the order the sidecar sent them. */
export function toolParameters(tool: ToolSchemaLike): JsonObject {
  const text = tool instanceof ToolSchema ? tool.parametersJson() : undefined;
  const schema: unknown = JSON.parse(text ?? JSON.stringify(tool.parameters ?? {}));
  if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
    throw invalid(`tool "${tool.name}" parameters are not a JSON object`);
  }
  return Object.keys(schema).length === 0 ? { type: "object" } : (schema as JsonObject);
}

function request<P extends JsonObject>(params: P, options: AdapterOptions): ProviderRequest<P> {
  return { params, report: { scope: options.scope, reportKey: options.reportKey } };
}

/** OpenAI Chat Completions: `openai.chat.completions.create({ model, ...request.params })`. */
export function openaiChat(
  prompt: AdaptedPrompt,
  messages: ProviderMessage[] = [],
  options: AdapterOptions & { systemRole?: "system" | "developer" } = {},
): ProviderRequest {
  const { prompt: text, contextSnapshot } = renderedOf(prompt);
  const sent: ProviderMessage[] = text ? [{ role: options.systemRole ?? "system", content: text }] : [];
  sent.push(...messages);
  if (contextSnapshot) sent.push({ role: "user", content: contextSnapshot });
  const params: JsonObject = { messages: sent };
  const tools = toolsOf(prompt).map((tool) => ({
    type: "function",
    function: {
      name: tool.name,
      description: tool.description,
      parameters: toolParameters(tool),
      strict: options.strict ?? false,
    },
  }));
  if (tools.length > 0) params["tools"] = tools; // the API refuses an empty list
  return request(params, options);
}

/** OpenAI Responses: `openai.responses.create({ model, ...request.params })`. */
export function openaiResponses(
  prompt: AdaptedPrompt,
  input: ProviderMessage[] = [],
  options: AdapterOptions = {},
): ProviderRequest {
  const { prompt: text, contextSnapshot } = renderedOf(prompt);
  const items = [...input];
  if (contextSnapshot) items.push({ role: "user", content: contextSnapshot });
  const params: JsonObject = { input: items };
  if (text) params["instructions"] = text;
  const tools = toolsOf(prompt).map((tool) => ({
    type: "function",
    name: tool.name,
    description: tool.description,
    parameters: toolParameters(tool),
    strict: options.strict ?? false,
  }));
  if (tools.length > 0) params["tools"] = tools;
  return request(params, options);
}

/**
 * Anthropic Messages: `anthropic.messages.create({ model, max_tokens, ...request.params })`.
 *
 * Unless `cache` is false, the last tool and the one system block carry `cache_control` (the
 * API reads tools, system, then messages); the snapshot, a user message after `messages`,
 * comes after both breakpoints.
 */
export function anthropicMessages(
  prompt: AdaptedPrompt,
  messages: ProviderMessage[] = [],
  options: AdapterOptions & { cache?: boolean; cacheTtl?: "5m" | "1h" } = {},
): ProviderRequest {
  const { prompt: text, contextSnapshot } = renderedOf(prompt);
  const cache = options.cache ?? true;
  const control = (): JsonObject =>
    options.cacheTtl ? { type: "ephemeral", ttl: options.cacheTtl } : { type: "ephemeral" };
  const params: JsonObject = {};
  const tools = toolsOf(prompt).map((tool) => {
    const entry: JsonObject = { name: tool.name, description: tool.description, input_schema: toolParameters(tool) };
    if (options.strict) entry["strict"] = true;
    return entry;
  });
  const last = tools.at(-1);
  if (last !== undefined) {
    if (cache) last["cache_control"] = control();
    params["tools"] = tools;
  }
  if (text) params["system"] = [cache ? { type: "text", text, cache_control: control() } : { type: "text", text }];
  const sent = [...messages];
  if (contextSnapshot) sent.push({ role: "user", content: [{ type: "text", text: contextSnapshot }] });
  params["messages"] = sent;
  return request(params, options);
}

/**
 * Gemini (@google/genai): `ai.models.generateContent({ model, ...request.params })`.
 *
 * The prompt is `config.systemInstruction`, the tools one `functionDeclarations` list whose
 * schemas are `parametersJsonSchema`, the snapshot a user content after `contents`.
 */
export function gemini(
  prompt: AdaptedPrompt,
  contents: ProviderMessage[] = [],
  options: Omit<AdapterOptions, "strict"> = {},
): ProviderRequest {
  const { prompt: text, contextSnapshot } = renderedOf(prompt);
  const sent = [...contents];
  if (contextSnapshot) sent.push({ role: "user", parts: [{ text: contextSnapshot }] });
  const config: JsonObject = {};
  if (text) config["systemInstruction"] = text;
  const declarations = toolsOf(prompt).map((tool) => ({
    name: tool.name,
    description: tool.description,
    parametersJsonSchema: toolParameters(tool),
  }));
  if (declarations.length > 0) config["tools"] = [{ functionDeclarations: declarations }];
  return request({ contents: sent, config }, options);
}
