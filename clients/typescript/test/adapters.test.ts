/**
 * The provider adapters and the AI SDK adapter, from a real sidecar's assembly. The openai,
 * Anthropic and Gemini JavaScript SDKs send their parameters with JSON.stringify: the bytes
 * checked here are those. The AI SDK runs generateText on its MockLanguageModelV4 (ai/test).
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { test } from "node:test";
import { generateText, stepCountIs } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import * as dsp from "../src/index.js";
import { aiSdkCall, aiSdkPrepareStep } from "../src/aiSdk.js";
import { useSidecar } from "./helpers.js";

// tool_order puts bash first: neither the registration nor the sorted order
const harness = useSidecar({ config: ["include_harness_identity = false", 'tool_order = ["bash", "<unlisted-tools>"]'] });

// keys in no sorted order, non-ASCII text, markup: the sidecar's bytes reach the body as they are
const BASH_JSON =
  '{"type":"object","properties":{"command":{"type":"string","description":"À exécuter <tel quel>"},' +
  '"timeout":{"type":"integer","minimum":1,"default":30}},"required":["command"]}';
const ORDER = ["bash", "apply_patch", "clock"];
const PROMPT = "You are a careful reviewer on deepseek-v4.";
const SNAPSHOT = `${dsp.CONTEXT_SNAPSHOT_HEADER}\n\nWorking directory: /work.`;
const HISTORY = [{ role: "user", content: "Review the patch." }];

async function loaded(): Promise<dsp.Client> {
  const client = await harness.connect();
  await client.variable("model", "deepseek-v4");
  await client.section("rules", 10, "You are a careful reviewer on {{model}}.");
  await client.context("cwd", 10, "Working directory: /work.");
  await client.tools([
    { name: "apply_patch", description: "Apply a patch.", parameters: { type: "object" } },
    { name: "bash", description: "Run a shell command.", parameters: JSON.parse(BASH_JSON) as dsp.JsonObject },
    { name: "clock", description: "Tell the time.", parameters: {} },
  ]);
  return client;
}

const tool = (name: string, rest: string): string => `{"type":"function","function":{"name":"${name}",${rest}}}`;

test("openaiChat: the prompt first, the snapshot last, tools in order with the sidecar's schema bytes", async () => {
  const client = await loaded();
  const rendered = await client.render({ report: true, reportKey: "conv-7" });
  const request = dsp.openaiChat(rendered, HISTORY, { reportKey: "conv-7" });
  assert.equal(
    JSON.stringify(request.params),
    `{"messages":[{"role":"system","content":"${PROMPT}"},{"role":"user","content":"Review the patch."},` +
      `{"role":"user","content":${JSON.stringify(SNAPSHOT)}}],"tools":[` +
      [
        tool("bash", `"description":"Run a shell command.","parameters":${BASH_JSON},"strict":false`),
        tool("apply_patch", `"description":"Apply a patch.","parameters":{"type":"object"},"strict":false`),
        tool("clock", `"description":"Tell the time.","parameters":{"type":"object"},"strict":false`),
      ].join(",") +
      "]}",
  );
  // the usage that comes back goes to the report the assembly was rendered under
  const entry = await client.reportUsage(
    { prompt_tokens: 120, prompt_tokens_details: { cached_tokens: 64 } },
    request.report,
  );
  assert.equal(entry.observedCachedTokens, 64);

  const strict = dsp.openaiChat(rendered, [], { strict: true, systemRole: "developer" });
  assert.deepEqual((strict.params["messages"] as unknown[])[0], { role: "developer", content: PROMPT });
  assert.equal(JSON.stringify(strict.params).split('"strict":true').length - 1, 3);
});

test("openaiResponses: instructions, input then the snapshot, flat tools", async () => {
  const client = await loaded();
  const request = dsp.openaiResponses(await client.render(), HISTORY);
  const body = JSON.stringify(request.params);
  assert.ok(body.startsWith(`{"input":[{"role":"user","content":"Review the patch."},{"role":"user","content":${JSON.stringify(SNAPSHOT)}}],"instructions":"${PROMPT}","tools":[`), body);
  assert.ok(body.includes(`{"type":"function","name":"bash","description":"Run a shell command.","parameters":${BASH_JSON},"strict":false}`), body);
  assert.deepEqual((request.params["tools"] as { name: string }[]).map((t) => t.name), ORDER);
});

test("anthropicMessages: breakpoints on the system block and the last tool, the snapshot after them", async () => {
  const client = await loaded();
  const rendered = await client.render({ report: true, reportKey: "conv-7" });
  const request = dsp.anthropicMessages(rendered, HISTORY, { reportKey: "conv-7" });
  assert.equal(
    JSON.stringify(request.params),
    `{"tools":[{"name":"bash","description":"Run a shell command.","input_schema":${BASH_JSON}},` +
      `{"name":"apply_patch","description":"Apply a patch.","input_schema":{"type":"object"}},` +
      `{"name":"clock","description":"Tell the time.","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}],` +
      `"system":[{"type":"text","text":"${PROMPT}","cache_control":{"type":"ephemeral"}}],` +
      `"messages":[{"role":"user","content":"Review the patch."},{"role":"user","content":[{"type":"text","text":${JSON.stringify(SNAPSHOT)}}]}]}`,
  );
  const entry = await client.reportUsage(
    { input_tokens: 20, cache_read_input_tokens: 64, cache_creation_input_tokens: 36 },
    request.report,
  );
  assert.deepEqual([entry.observedCachedTokens, entry.observedPromptTokens], [64, 120]);

  const ttl = JSON.stringify(dsp.anthropicMessages(rendered, [], { cacheTtl: "1h", strict: true }).params);
  assert.equal(ttl.split('"cache_control":{"type":"ephemeral","ttl":"1h"}').length - 1, 2);
  assert.equal(ttl.split('"strict":true').length - 1, 3);
  assert.ok(!JSON.stringify(dsp.anthropicMessages(rendered, [], { cache: false }).params).includes("cache_control"));
});

test("gemini: systemInstruction, parametersJsonSchema, the snapshot after the contents", async () => {
  const client = await loaded();
  const rendered = await client.render({ report: true, reportKey: "conv-7" });
  const contents = [{ role: "user", parts: [{ text: "Review the patch." }] }];
  const request = dsp.gemini(rendered, contents, { reportKey: "conv-7" });
  assert.equal(
    JSON.stringify(request.params),
    `{"contents":[{"role":"user","parts":[{"text":"Review the patch."}]},{"role":"user","parts":[{"text":${JSON.stringify(SNAPSHOT)}}]}],` +
      `"config":{"systemInstruction":"${PROMPT}","tools":[{"functionDeclarations":[` +
      `{"name":"bash","description":"Run a shell command.","parametersJsonSchema":${BASH_JSON}},` +
      `{"name":"apply_patch","description":"Apply a patch.","parametersJsonSchema":{"type":"object"}},` +
      `{"name":"clock","description":"Tell the time.","parametersJsonSchema":{"type":"object"}}]}]}}`,
  );
  const entry = await client.reportUsage({ promptTokenCount: 120, cachedContentTokenCount: 64 }, request.report);
  assert.deepEqual([entry.observedCachedTokens, entry.observedPromptTokens], [64, 120]);
});

test("an assembly is rendered here; a schema that is not an object is refused", async () => {
  const client = await loaded();
  assert.deepEqual(dsp.openaiChat(await client.assemble()).params, dsp.openaiChat(await client.render()).params);
  const odd = dsp.ToolSchema.fromJson("odd", "", "[1]");
  assert.throws(() => dsp.toolParameters(odd), /tool "odd" parameters are not a JSON object/);
});

interface Seen {
  prompt: { role: string; content: unknown }[];
  tools: { name: string; inputSchema: unknown }[];
}

test("the AI SDK: each step assembled, its tools sent in the assembly's order, the snapshot last", async () => {
  const client = await loaded();
  const seen: Seen[] = [];
  const usage = {
    inputTokens: { total: 120, noCache: 56, cacheRead: 64, cacheWrite: 0 },
    outputTokens: { total: 2, text: 2, reasoning: 0 },
  };
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => {
      seen.push(options as unknown as Seen);
      const content =
        seen.length === 1
          ? [{ type: "tool-call" as const, toolCallId: "call_1", toolName: "bash", input: '{"command":"ls"}' }]
          : [{ type: "text" as const, text: "Looks fine." }];
      const finishReason = seen.length === 1 ? "tool-calls" : "stop";
      return { content, finishReason: { unified: finishReason, raw: finishReason }, usage, warnings: [] };
    },
  });
  const ran: unknown[] = [];
  const handlers = {
    bash: async (input: never) => {
      ran.push(input);
      // between the two steps: the prompt grows and the clock tool goes away
      await client.section("later", 20, "Tools have run.");
      await client.onAssemble((assembly, _context, next) => {
        assembly.tools = assembly.tools.filter((t) => t.name !== "clock");
        return next();
      });
      return "README.md";
    },
    apply_patch: async () => "unused",
    clock: async () => "unused",
  };
  const rendered = await client.render({ report: true, reportKey: "conv-7" });
  const result = await generateText({
    model,
    ...aiSdkCall(rendered, handlers, [{ role: "user", content: "Review the patch." }]),
    prepareStep: aiSdkPrepareStep(client, { report: true, reportKey: "conv-7" }),
    stopWhen: stepCountIs(3),
  });

  assert.equal(result.text, "Looks fine.");
  assert.deepEqual(ran, [{ command: "ls" }]);
  // the AI SDK's prompt messages carry undefined fields (providerOptions): compared as JSON
  const [first, second] = JSON.parse(JSON.stringify(seen)) as Seen[];
  assert.ok(first !== undefined && second !== undefined);
  assert.deepEqual(first.prompt[0], { role: "system", content: PROMPT });
  assert.deepEqual(first.prompt.at(-1), { role: "user", content: [{ type: "text", text: SNAPSHOT }] });
  assert.deepEqual(first.tools.map((t) => t.name), ORDER); // the AI SDK alone would sort them
  assert.equal(JSON.stringify(first.tools[0]?.inputSchema), BASH_JSON);
  assert.deepEqual(second.prompt[0], { role: "system", content: `${PROMPT}\n\nTools have run.` });
  assert.deepEqual(second.tools.map((t) => t.name), ["bash", "apply_patch"]);
  assert.deepEqual(second.prompt.at(-1), { role: "user", content: [{ type: "text", text: SNAPSHOT }] });

  const entry = await client.reportUsage(result.steps.at(-1)?.usage, { reportKey: "conv-7" });
  assert.deepEqual([entry.observedCachedTokens, entry.observedPromptTokens], [64, 120]);
});

test("docs/adapters.md's TypeScript loop runs as written", async () => {
  const doc = readFileSync(new URL("../../../../docs/adapters.md", import.meta.url), "utf-8");
  const block = /<!-- adapters-typescript-loop -->\n```js\n([\s\S]*?)```/.exec(doc)?.[1];
  assert.ok(block !== undefined, "docs/adapters.md has no <!-- adapters-typescript-loop --> block");
  // inside the package, so that "@dsh/system-prompt" is the package itself (self-reference)
  const script = fileURLToPath(new URL(`../doc-loop-${process.pid}.mjs`, import.meta.url));
  writeFileSync(script, block);
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [script, harness.sidecar.address], {
      timeout: 60_000,
    });
    // the file's other tests reported under conv-7 on this sidecar first: two reports more
    const lines = stdout.trim().split("\n");
    const first = Number(/report (\d+) of conv-7$/.exec(lines[0] ?? "")?.[1]);
    assert.deepEqual(lines, [
      `turn 1: 64 of 120 prompt tokens cached, report ${first} of conv-7`,
      `turn 2: 64 of 120 prompt tokens cached, report ${first + 1} of conv-7`,
    ]);
  } finally {
    rmSync(script);
  }
});
