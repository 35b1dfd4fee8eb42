/** An agent written against the original `ctx.systemPrompt` API runs with only its import changed. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, toolNames, useSidecar, waitFor } from "./helpers.js";
import { Sidecar } from "./sidecar.js";

interface AgentContext {
  systemPrompt: dsp.SystemPromptService;
}

/** Plugin code as it is written for the in-process registry: no await on registrations. */
function installPlugins(ctx: AgentContext): { offCwd: () => void } {
  ctx.systemPrompt.variable("model", () => "deepseek-v4");
  ctx.systemPrompt.section({ name: "rules", order: 10, text: "You run on {{model}}. Be precise." });
  const offCwd = ctx.systemPrompt.context({
    name: "cwd",
    order: 20,
    text: (context) => `cwd: ${String(context.fields["cwd"])}`,
  });
  ctx.systemPrompt.tools(() => ({
    schemas: [{ name: "bash", description: "run a command", parameters: { type: "object" } }],
  }));
  return { offCwd };
}

const harness = useSidecar();

test("registrations return a plain disposer and the next assembly sees them", async () => {
  const ctx = { systemPrompt: dsp.systemPrompt(await harness.connect()) };
  const { offCwd } = installPlugins(ctx);
  const assembly = await ctx.systemPrompt.assemble({ cwd: "/work" });
  assert.equal(dsp.renderPrompt(assembly).endsWith("You run on deepseek-v4. Be precise."), true);
  assert.equal(dsp.renderContextSnapshot(assembly).endsWith("cwd: /work"), true);
  assert.deepEqual(toolNames(assembly), ["bash"]);

  offCwd();
  assert.deepEqual((await ctx.systemPrompt.assemble({ cwd: "/work" })).contexts, []);
});

test("a registration the sidecar refuses fails the next assembly, once", async () => {
  const ctx = { systemPrompt: dsp.systemPrompt(await harness.connect()) };
  ctx.systemPrompt.section({ name: "twice", order: 1, text: "First." });
  ctx.systemPrompt.section({ name: "twice", order: 2, text: "Second." });
  const error = await failure(ctx.systemPrompt.assemble());
  assert.equal(error.reason, dsp.Reason.DUPLICATE_NAME);
  assert.deepEqual(ownSections(await ctx.systemPrompt.assemble()), ["twice"]);
});

test("a scope handle gives the scope's layer, like agent.ctx", async () => {
  const client = await harness.connect();
  const global = dsp.systemPrompt(client);
  const agent = dsp.systemPrompt(await client.scope("agent-1"), client);
  global.section({ name: "persona", order: 5, text: "Global." });
  agent.section({ name: "persona", order: 5, text: "Agent." });
  const assembly = await agent.assemble({ scope: "agent-1" });
  assert.equal(assembly.sections.find((s) => s.name === "persona")?.text, "Agent.");
  assert.equal((await global.assemble()).sections.find((s) => s.name === "persona")?.text, "Global.");
});

test("the agent survives a sidecar restart", async () => {
  let sidecar = await Sidecar.start();
  const address = sidecar.address;
  const client = await dsp.connect(address);
  try {
    const ctx = { systemPrompt: dsp.systemPrompt(client) };
    installPlugins(ctx);
    const before = dsp.renderPrompt(await ctx.systemPrompt.assemble({ cwd: "/a" }));
    const session = client.sessionId;
    await sidecar.stop();
    sidecar = await Sidecar.restartAt(address);
    await waitFor(() => client.connected && client.sessionId !== session, "the reconnect");
    const after = await ctx.systemPrompt.assemble({ cwd: "/a" });
    assert.equal(dsp.renderPrompt(after), before);
    assert.deepEqual(toolNames(after), ["bash"]);
  } finally {
    await client.close();
    await sidecar.stop();
  }
});
