/**
 * The local cache's answers of a rules-only plan (`cacheableWithFields`), against a real
 * sidecar: kept under the scope and the request's very fields, never served for other
 * fields, counted in `localCacheBytes`, and gone with the rule's change, its session's end or
 * a restart (docs/protocol.md, "The local cache").
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { acrossARestart, assembleCounter, eventually, useSidecar } from "./helpers.js";

const harness = useSidecar();

/** A rule that appends a section greeting `fields.who`, when it is set, with `greeting`. */
function greet(greeting = "Hello"): dsp.Rule {
  const text = `'${greeting} ' + fields.who + '.'`;
  const mutations = [dsp.Mutation.upsertSections({ name: "greeting", order: 50, text })];
  return { match: ["'who' in fields"], mutations };
}

/** The greeting section's text in `client`'s assembly for `who` (undefined: none). */
async function greeting(client: dsp.Client, who?: string): Promise<string | undefined> {
  const assembly = await client.assemble(who === undefined ? {} : { fields: { who } });
  return assembly.sections.find((section) => section.name === "greeting")?.text;
}

/** A client with its local cache on, and the count of the Assemble calls it made. */
async function caching(options: dsp.ConnectOptions = {}): Promise<{ client: dsp.Client; count: () => number }> {
  const { interceptor, count } = assembleCounter();
  const client = await harness.connect({ ...options, localCache: true, interceptors: [interceptor] });
  return { client, count };
}

test("a rules-only scope is kept by its fields, each value with its own text", async () => {
  const { client, count } = await caching();
  await client.section("rules", 10, "be brief");
  await client.rule("greet", greet());
  const before = count();
  assert.equal(await greeting(client, "ada"), "Hello ada.");
  assert.equal(await greeting(client, "bob"), "Hello bob."); // not ada's, kept under other fields
  assert.equal(count(), before + 2);
  assert.equal(await greeting(client, "ada"), "Hello ada.");
  assert.equal(await greeting(client, "bob"), "Hello bob.");
  assert.equal(count(), before + 2); // both answered here
  assert.equal(await greeting(client), undefined); // no fields: its own answer
  assert.equal(await greeting(client, "eve"), "Hello eve.");
  assert.equal(count(), before + 4);
});

test("a scope with a rule and a listener is asked every time", async () => {
  const { client, count } = await caching();
  await client.rule("greet", greet());
  await client.onAssemble((_assembly, _context, next) => next());
  await greeting(client, "ada");
  const before = count();
  assert.equal(await greeting(client, "ada"), "Hello ada.");
  assert.equal(count(), before + 1);
});

test("a rule's update (own or another's) and its session's end reach the answers kept by fields", async () => {
  const { client } = await caching();
  const own = await client.rule("own", greet());
  await greeting(client, "ada");
  await own.update(greet("Hi"));
  assert.equal(await greeting(client, "ada"), "Hi ada."); // read-your-writes
  await own();
  const other = await harness.connect();
  const handle = await other.rule("greet", greet());
  await eventually(async () => (await greeting(client, "ada")) === "Hello ada.", "the other's rule");
  assert.equal(await greeting(client, "bob"), "Hello bob.");
  await handle.update(greet("HELLO"));
  await eventually(async () => (await greeting(client, "ada")) === "HELLO ada.", "the update for ada");
  await eventually(async () => (await greeting(client, "bob")) === "HELLO bob.", "the update for bob");
  await other.close();
  await eventually(async () => (await greeting(client, "ada")) === undefined, "the session's end");
});

test("answers kept by fields count toward localCacheBytes", async () => {
  const owner = await harness.connect();
  const scope = await owner.scope("budget");
  await scope.section("text", 1, "x".repeat(30_000)); // 60,000 bytes in each answer, two a unit
  await scope.rule("greet", greet());
  const { client, count } = await caching({ localCacheBytes: 100_000 });
  const ask = (who: string): Promise<dsp.PromptAssembly> => client.assemble({ scope: "budget", fields: { who } });
  await ask("ada");
  const before = count();
  await ask("ada");
  assert.equal(count(), before); // kept
  await ask("bob");
  await ask("bob");
  assert.equal(count(), before + 1); // bob's kept, ada's pushed out
  await ask("ada");
  assert.equal(count(), before + 2);
});

test("a sidecar restart leaves no answer kept by fields of the old one", () =>
  acrossARestart(async (owner, client, restart) => {
    const rule = await owner.rule("greet", greet("v0"));
    // far above the new sidecar's revisions
    for (let version = 1; version < 20; version += 1) await rule.update(greet(`v${version}`));
    await eventually(async () => (await greeting(client, "ada")) === "v19 ada.", "the last rule");
    await restart();
    await rule.update(greet("after"));
    await eventually(async () => (await greeting(client, "ada")) === "after ada.", "the new sidecar's rule");
  }));
