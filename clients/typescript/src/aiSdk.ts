/**
 * The Vercel AI SDK (`ai`): an assembly as `generateText`'s instructions, messages, tools and
 * tool order. Its own entry point, `@dsh/system-prompt/ai-sdk`, imports `ai`; the client's
 * main entry never does, and `ai` is not one of its dependencies.
 *
 * ```ts
 * import { aiSdkCall, aiSdkPrepareStep } from "@dsh/system-prompt/ai-sdk";
 * const rendered = await client.render({ report: true, reportKey: "conv-7" });
 * const result = await generateText({ model, ...aiSdkCall(rendered, handlers, messages) });
 * await client.reportUsage(result.usage, { reportKey: "conv-7" });
 * ```
 *
 * The AI SDK sends tools sorted by name unless given `toolOrder`: the adapter gives it the
 * assembly's order. Schemas go through `jsonSchema()` as the sidecar sent them.
 */

import { jsonSchema, tool, type ModelMessage, type PrepareStepFunction, type ToolSet } from "ai";

import { renderedOf, toolParameters, type AdaptedPrompt } from "./adapters.js";
import type { AssembleOptions, Client } from "./client.js";

/** A tool's implementation: the model's input in, the tool's output out. */
export type ToolHandler = (input: never) => unknown;

function toolsOf(prompt: AdaptedPrompt) {
  return "assembly" in prompt ? prompt.assembly.tools : prompt.tools;
}

/** An AI SDK tool for each assembled tool with a handler (the object's key order is not kept). */
export function aiSdkTools(prompt: AdaptedPrompt, handlers: Record<string, ToolHandler>): ToolSet {
  const tools: ToolSet = {};
  for (const schema of toolsOf(prompt)) {
    const execute = handlers[schema.name];
    if (execute === undefined) continue;
    tools[schema.name] = tool({
      description: schema.description,
      inputSchema: jsonSchema(toolParameters(schema)),
      execute: execute as (input: unknown) => unknown,
    });
  }
  return tools;
}

/** `generateText({ model, ...aiSdkCall(prompt, handlers, messages) })`: one assembly's call. */
export function aiSdkCall(
  prompt: AdaptedPrompt,
  handlers: Record<string, ToolHandler>,
  messages: ModelMessage[] = [],
): { instructions: string; messages: ModelMessage[]; tools: ToolSet; toolOrder: string[] } {
  const { prompt: instructions, contextSnapshot } = renderedOf(prompt);
  const tools = aiSdkTools(prompt, handlers);
  return {
    instructions,
    messages: contextSnapshot ? [...messages, { role: "user", content: contextSnapshot }] : messages,
    tools,
    toolOrder: toolsOf(prompt)
      .map((schema) => schema.name)
      .filter((name) => name in tools),
  };
}

/**
 * `generateText({ ..., prepareStep: aiSdkPrepareStep(client, options) })`: each step of a
 * multi-step call assembled anew: its prompt as the instructions, its tools active in its
 * order, its snapshot after the messages.
 */
export function aiSdkPrepareStep(client: Client, options: AssembleOptions = {}): PrepareStepFunction<ToolSet> {
  return async ({ messages }) => {
    const rendered = await client.render(options);
    const names = rendered.assembly.tools.map((schema) => schema.name);
    return {
      instructions: rendered.prompt,
      activeTools: names,
      toolOrder: names,
      messages: rendered.contextSnapshot ? [...messages, { role: "user", content: rendered.contextSnapshot }] : messages,
    };
  };
}
