/** The local cache (`connect(address, { localCache: true })`) against a real sidecar: no change, whoever makes it, leaves a stale answer behind. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { acrossARestart, eventually, ownSections, useSidecar } from "./helpers.js";

const harness = useSidecar();

function texts(assembly: dsp.PromptAssembly): Record<string, string> {
  return Object.fromEntries(assembly.sections.map((section) => [section.name, section.text]));
}

async function sees(client: dsp.Client, name: string, text: string, scope?: string): Promise<boolean> {
  return texts(await client.assemble({ scope }))[name] === text;
}

test("each kept answer is a copy the caller may change", async () => {
  const client = await harness.connect({ localCache: true });
  await client.section("rules", 10, "be brief");
  await client.variable("model", "m1");
  await client.assemble();
  const kept = await client.assemble();
  kept.sections.length = 0;
  kept.variables["model"] = "changed";
  const again = await client.assemble();
  assert.ok(ownSections(again).includes("rules"));
  assert.equal(again.variables["model"], "m1");
});

test("an own update is seen by the next assemble", async () => {
  const client = await harness.connect({ localCache: true });
  const rules = await client.section("rules", 10, "be brief");
  await client.assemble();
  await rules.update("be thorough");
  assert.equal(texts(await client.assemble())["rules"], "be thorough");
});

test("an own registration is seen by the next assemble", async () => {
  const client = await harness.connect({ localCache: true });
  await client.assemble();
  await client.section("rules", 10, "be brief");
  assert.ok(ownSections(await client.assemble()).includes("rules"));
});

test("an own disposal is seen by the next assemble", async () => {
  const client = await harness.connect({ localCache: true });
  const off = await client.section("rules", 10, "be brief");
  await client.assemble();
  await off();
  assert.ok(!ownSections(await client.assemble()).includes("rules"));
});

test("an own listener is seen by the next assemble", async () => {
  const client = await harness.connect({ localCache: true });
  await client.assemble();
  await client.onAssemble(async (assembly, _context, next) => {
    assembly.sections.push({ name: "shout", text: "LOUD" });
    return next();
  });
  assert.ok(ownSections(await client.assemble()).includes("shout"));
});

test("another client's update reaches the kept answer", async () => {
  const caching = await harness.connect({ localCache: true });
  const other = await harness.connect();
  const rules = await other.section("rules", 10, "be brief");
  await eventually(() => sees(caching, "rules", "be brief"), "the first value");
  await rules.update("be thorough");
  await eventually(() => sees(caching, "rules", "be thorough"), "the update");
});

test("a re-parented scope is assembled under its new parent", async () => {
  const caching = await harness.connect({ localCache: true });
  const other = await harness.connect();
  const [teamA, teamB] = [await other.scope("team-a"), await other.scope("team-b")];
  await teamA.section("team", 10, "a");
  await teamB.section("team", 10, "b");
  const worker = await other.scope("worker", "team-a");
  await eventually(() => sees(caching, "team", "a", "worker"), "team-a's section");
  await worker.dispose();
  await other.scope("worker", "team-b");
  await eventually(() => sees(caching, "team", "b", "worker"), "team-b's section");
});

test("a sidecar restart leaves no answer of the old one", () =>
  acrossARestart(async (owner, caching, restart) => {
    const rules = await owner.section("rules", 10, "v0");
    for (let version = 1; version < 20; version += 1) await rules.update(`v${version}`); // far above the new sidecar's revisions
    await eventually(() => sees(caching, "rules", "v19"), "the last value");
    await restart();
    await rules.update("after the restart");
    await eventually(() => sees(caching, "rules", "after the restart"), "the new sidecar's value");
  }));
