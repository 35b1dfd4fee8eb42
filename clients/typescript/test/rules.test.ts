/**
 * The rules API: `client.rule` and `scope.rule`, the typed builders of `dsp.Mutation` and the
 * `Rule` / `RulePart` shapes, what they refuse before sending, and the handle (update, dispose),
 * against a real sidecar (docs/protocol.md, "Rules").
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, toolNames, useSidecar } from "./helpers.js";

const harness = useSidecar();
const TOOLS = ["bash", "mcp__github__issue", "todo_write", "web_fetch"].map((name) => ({
  name,
  description: `${name} does things`,
  parameters: {},
}));

test("every mutation kind, match and variables apply as the sidecar runs them", async () => {
  const client = await harness.connect();
  await client.tools(TOOLS);
  await client.section("intro", 10, "Hello.");
  await client.section("outro", 30, "Bye.");
  await client.context("clock", 10, "noon");
  await client.context("cwd", 20, "/work");
  await client.variable("model", "v3");
  await client.variable("region", "eu");
  await client.rule("all", {
    match: ["'agent' in fields"],
    variables: { agent: "fields.agent" },
    mutations: [
      dsp.Mutation.dropTools("tool.name.startsWith('web_')"),
      dsp.Mutation.keepTools("tool.name != 'todo_write'"),
      dsp.Mutation.toolOrder(["mcp__github__issue"]),
      dsp.Mutation.upsertSections({ name: "who", order: 20, text: "'Agent ' + variables.agent" }),
      dsp.Mutation.dropSections("section.name == 'outro'"),
      dsp.Mutation.upsertContexts({ name: "cwd", order: 0, text: "'/elsewhere'" }),
      dsp.Mutation.dropContexts("context.name == 'clock'"),
      dsp.Mutation.setVariables({ model: "'v4-' + variables.agent", region: undefined }),
    ],
  });
  const before = await client.assemble();
  assert.deepEqual(toolNames(before), ["bash", "mcp__github__issue", "todo_write", "web_fetch"]);
  const assembly = await client.assemble({ fields: { agent: "ada" } });
  assert.deepEqual(toolNames(assembly), ["mcp__github__issue", "bash"]);
  assert.deepEqual(ownSections(assembly), ["intro", "who"]);
  assert.equal(assembly.sections.at(-1)?.text, "Agent ada");
  assert.deepEqual(
    assembly.contexts.map((context) => [context.name, context.text]),
    [["cwd", "/elsewhere"]],
  );
  assert.deepEqual(assembly.variables, { model: "v4-ada", region: undefined });
});

test("scope.rule runs in its scope only; the handle updates it in place and disposes it", async () => {
  const client = await harness.connect();
  await client.tools(TOOLS.slice(0, 2));
  const scope = await client.scope("agent-rules");
  const handle = await scope.rule("one", { mutations: [dsp.Mutation.dropTools("tool.name == 'bash'")] });
  assert.deepEqual(toolNames(await client.assemble({ scope: "agent-rules" })), ["mcp__github__issue"]);
  assert.deepEqual(toolNames(await client.assemble()), ["bash", "mcp__github__issue"]);
  const changes = await client.watchChanges({ kinds: ["rule"], scope: "agent-rules" });
  await handle.update({ mutations: [dsp.Mutation.dropTools("tool.name != 'bash'")] });
  const item = await changes.next();
  assert.ok(!item.done && item.value.type === "change");
  assert.deepEqual([item.value.action, item.value.kind, item.value.name], ["updated", "rule", "one"]);
  changes.close();
  assert.deepEqual(toolNames(await client.assemble({ scope: "agent-rules" })), ["bash"]);
  await handle();
  assert.ok(handle.disposed);
  assert.deepEqual(toolNames(await client.assemble({ scope: "agent-rules" })), ["bash", "mcp__github__issue"]);
});

test("prepend and global place a rule among the waterfall's steps", async () => {
  const client = await harness.connect();
  const scope = await client.scope("agent-order");
  const upsert = (text: string): dsp.Rule => ({
    mutations: [dsp.Mutation.upsertSections({ name: "last", order: 99, text })],
  });
  await scope.rule("later", upsert("'later'"), { global: true });
  await client.rule("first", upsert("'first'"), { prepend: true });
  assert.equal((await client.assemble()).sections.at(-1)?.text, "later"); // global: runs everywhere
  assert.equal((await client.assemble({ scope: "agent-order" })).sections.at(-1)?.text, "later");
});

test("a listing reads a rule back as it was given", async () => {
  const client = await harness.connect();
  const rule: dsp.Rule = {
    mutations: [
      dsp.Mutation.toolOrder(["a", "b"]),
      dsp.Mutation.setVariables({ v: "'x'", w: null }),
    ],
    match: ["true"],
    variables: { n: "1" },
    failurePolicy: dsp.FailurePolicy.IGNORE,
  };
  await client.rule("listed", rule);
  const snapshot = await client.snapshot({ kinds: ["rule"], values: true });
  const listed = snapshot.registrations.find((info) => info.name === "listed");
  assert.equal(listed?.kind, "rule");
  assert.deepEqual(listed?.value, rule);
});

test("a malformed rule is refused in the client; a bad expression by the sidecar, naming it", async () => {
  const client = await harness.connect();
  const refused = async (make: () => Promise<unknown>, message: string): Promise<void> => {
    const error = await failure(Promise.resolve().then(make));
    assert.equal(error.reason, dsp.Reason.INVALID_VALUE);
    assert.ok(error.message.startsWith(message), error.message);
  };
  await refused(() => client.rule("r", { match: "true" as unknown as string[] }), "a rule's match is an array");
  await refused(
    () => client.rule("r", { mutations: ["drop" as unknown as dsp.Mutation] }),
    "a rule's mutations are made by dsp.Mutation, not string",
  );
  await refused(() => client.rule("r", { match: [1 as unknown as string] }), "a rule's expression must be a string");
  await refused(
    () => client.rule("r", { failurePolicy: "maybe" as dsp.FailurePolicy }),
    'failurePolicy must be "fail" or "ignore"',
  );
  await refused(
    async () => dsp.Mutation.upsertSections({ name: "s", order: Number.NaN, text: "'x'" }),
    "a rule part's order must be a finite number, not NaN",
  );
  const invalid = await failure(
    client.rule("typo", { mutations: [dsp.Mutation.dropTools("tool.nme == 'x'")] }),
  );
  assert.equal(invalid.reason, dsp.Reason.RULE_INVALID);
  assert.ok(invalid.message.startsWith(`rule "typo": mutations[0].drop_tools:1:5: undefined field 'nme'`), invalid.message);
  const section = await client.section("s", 1, "text");
  const wrong = await failure(section.update({ mutations: [] }));
  assert.equal(wrong.message, "the new text must be a string, not object");
});

test("a rule failing at run time fails the assembly, or is skipped under ignore", async () => {
  const client = await harness.connect();
  const scope = await client.scope("agent-fails");
  const handle = await scope.rule("boom", { match: ["fields.absent == 1"] });
  const error = await failure(client.assemble({ scope: "agent-fails" }));
  assert.equal(error.reason, dsp.Reason.RULE_FAILED);
  assert.equal(error.message, `rule "boom" failed: match[0]: Key not found in map : "absent"`);
  await handle.update({ match: ["fields.absent == 1"], failurePolicy: "ignore" });
  const assembly = await client.assemble({ scope: "agent-fails" });
  assert.deepEqual(
    (assembly.skipped ?? []).map((step) => [step.kind, step.name, step.reason]),
    [["rule", "boom", "RULE_FAILED"]],
  );
});
