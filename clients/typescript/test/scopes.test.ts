/** Scopes: layers, shadowing, parents, scoped listeners, disposal of a handle. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, ownSections, toolNames, useSidecar } from "./helpers.js";

const harness = useSidecar();

test("a scoped section shadows a global one of the same name for that scope only", async () => {
  const client = await harness.connect();
  await client.section("persona", 10, "Global.");
  const agent = await client.scope("agent-1");
  await agent.section("persona", 10, "Agent.");
  assert.equal((await client.assemble({ scope: "agent-1" })).sections.at(-1)?.text, "Agent.");
  assert.equal((await client.assemble()).sections.at(-1)?.text, "Global.");
});

test("a child sees its parents' layers, the nearest winning, and a parent not its child's", async () => {
  const client = await harness.connect();
  const team = await client.scope("team");
  const agent = await client.scope("agent-2", "team");
  await team.section("rules", 10, "Team rules.");
  await team.variable("who", "team");
  await agent.variable("who", "agent");
  await agent.section("own", 20, "Agent only.");
  await team.tools([{ name: "team_tool", description: "", parameters: {} }]);
  const child = await client.assemble({ scope: "agent-2" });
  assert.deepEqual(ownSections(child), ["rules", "own"]);
  assert.equal(child.variables["who"], "agent");
  assert.deepEqual(toolNames(child), ["team_tool"]);
  assert.deepEqual(ownSections(await client.assemble({ scope: "team" })), ["rules"]);
});

test("a conflicting parent is rejected with ALREADY_EXISTS", async () => {
  const client = await harness.connect();
  await client.scope("child", "one");
  const error = await failure(client.scope("child", "two"));
  assert.equal(error.code, dsp.Code.ALREADY_EXISTS);
  assert.equal(error.reason, dsp.Reason.SCOPE_PARENT_CONFLICT);
});

test("a parent that would close a cycle is INVALID_ARGUMENT", async () => {
  const client = await harness.connect();
  await client.scope("b", "a");
  const error = await failure(client.scope("a", "b"));
  assert.equal(error.code, dsp.Code.INVALID_ARGUMENT);
  assert.equal(error.reason, dsp.Reason.SCOPE_CYCLE);
});

test("a scoped listener sees its scope's and descendants' assemblies; global sees all", async () => {
  const client = await harness.connect();
  const team = await client.scope("squad");
  await client.scope("member", "squad");
  const seen: (string | undefined)[] = [];
  const everywhere: (string | undefined)[] = [];
  await team.onAssemble((assembly, context, next) => {
    seen.push(context.scope);
    return next();
  });
  await team.onAssemble(
    (assembly, context, next) => {
      everywhere.push(context.scope);
      return next();
    },
    { global: true },
  );
  for (const scope of [undefined, "squad", "member", "elsewhere"]) await client.assemble({ scope });
  assert.deepEqual(seen, ["squad", "member"]);
  assert.deepEqual(everywhere, [undefined, "squad", "member", "elsewhere"]);
});

test("disposing a scope handle disposes everything registered through it", async () => {
  const client = await harness.connect();
  const scope = await client.scope("temporary");
  await scope.section("one", 10, "One.");
  const off = await scope.context("two", 1, () => "Two.");
  await scope.dispose();
  await off(); // already gone with its scope: still harmless
  const assembly = await client.assemble({ scope: "temporary" });
  assert.deepEqual(ownSections(assembly), []);
  assert.deepEqual(assembly.contexts, []);
});
