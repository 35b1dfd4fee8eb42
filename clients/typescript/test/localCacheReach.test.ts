/**
 * The local cache keyed by reach and bounded in bytes (issue 34, items 6 and 8), against a
 * real sidecar: a kept answer goes with a change to a layer it read and outlives changes
 * anywhere else; one answer per scope whatever the fields; what is kept is bounded by
 * `localCacheBytes`; an agent that may read only its own scopes has a local cache too, told
 * of a step registered with `global` wherever it is held.
 */

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import { assembleCounter, eventually, failure, ownSections, useSidecar } from "./helpers.js";
import { Sidecar, temporaryFolder } from "./sidecar.js";

const harness = useSidecar();

async function sees(client: dsp.Client, scope: string, name: string): Promise<boolean> {
  return ownSections(await client.assemble({ scope })).includes(name);
}

/** Whether `scope`'s next assemble() is answered without a call (`count` counts the calls). */
function keeper(client: dsp.Client, count: () => number): (scope: string) => Promise<boolean> {
  return async (scope) => {
    await client.assemble({ scope });
    const before = count();
    await client.assemble({ scope });
    return count() === before;
  };
}

/**
 * "solo" bound under "upper" and held to the end only as the parent of "kid": once "kid"
 * goes, nothing holds "solo" and its binding goes with it, so its chain is itself alone,
 * though no event of its own layer says so; the sidecar names it in `reboundScopes`, and
 * neither its kept answers (the owner's assembly) nor the local cache serve "upper"'s
 * section on.
 */
async function forgetsItsParent(
  owner: dsp.Client,
  cache: dsp.Client,
  kept: (scope: string) => Promise<boolean>,
): Promise<void> {
  await (await owner.scope("upper")).section("upper", 5, "upper's");
  const kid = await owner.scope("kid", "solo");
  await (await owner.scope("solo", "upper")).dispose();
  await eventually(() => kept("solo"), "a kept answer");
  assert.ok(await sees(cache, "solo", "upper"));
  await kid.dispose();
  assert.ok(!(await sees(owner, "solo", "upper")));
  await eventually(async () => !(await sees(cache, "solo", "upper")), "the chain without its parent");
}

test("a scope forgotten with its parent is not served its old chain", async () => {
  const { interceptor, count } = assembleCounter();
  const caching = await harness.connect({ localCache: true, interceptors: [interceptor] });
  await forgetsItsParent(await harness.connect(), caching, keeper(caching, count));
});

test("another scope's churn leaves the kept answer", async () => {
  const { interceptor, count } = assembleCounter();
  const caching = await harness.connect({ localCache: true, interceptors: [interceptor] });
  const [alice, bob] = [await harness.connect(), await harness.connect()];
  await alice.scope("team");
  const mine = await alice.scope("alice", "team");
  const his = await bob.scope("bob", "team");
  await mine.section("rules", 10, "alice's");
  await caching.assemble({ scope: "alice" });
  const before = count();
  for (let number = 0; number < 20; number += 1) {
    const off = await his.section(`churn-${number}`, 5, "bob's");
    await caching.assemble({ scope: "alice" });
    await off();
    assert.ok(ownSections(await caching.assemble({ scope: "alice" })).includes("rules"));
  }
  assert.equal(count(), before);
});

test("a change of a layer the answer read reaches it", async () => {
  const caching = await harness.connect({ localCache: true });
  const alice = await harness.connect();
  const team = await alice.scope("team-2");
  const mine = await alice.scope("alice-2", "team-2");
  await mine.section("rules", 10, "alice's");
  await eventually(() => sees(caching, "alice-2", "rules"), "alice's section");
  await team.section("parent", 5, "team's");
  await eventually(() => sees(caching, "alice-2", "parent"), "the parent's section");
  await alice.section("everyone", 1, "global");
  await eventually(() => sees(caching, "alice-2", "everyone"), "the global section");
});

test("a global listener made in another scope reaches the kept answer", async () => {
  const caching = await harness.connect({ localCache: true });
  const [alice, bob] = [await harness.connect(), await harness.connect()];
  await (await alice.scope("alice-3")).section("rules", 10, "alice's");
  await caching.assemble({ scope: "alice-3" });
  await (await bob.scope("bob-3")).onAssemble(
    (assembly, _context, next) => {
      assembly.sections.push({ name: "marked", text: "by bob" });
      return next();
    },
    { global: true },
  );
  await eventually(() => sees(caching, "alice-3", "marked"), "bob's global listener");
});

for (const step of ["listener", "rule"] as const) {
  test(`a ${step} registered on another scope leaves the kept answer`, async () => {
    // its event says global false: alice's answer stays (before, any step's event dropped
    // every kept answer); the marker after it in carol's scope, once seen, tells that the
    // step's event came first (one stream, in order)
    const { interceptor, count } = assembleCounter();
    const caching = await harness.connect({ localCache: true, interceptors: [interceptor] });
    const [alice, bob] = [await harness.connect(), await harness.connect()];
    await (await alice.scope(`alice-${step}`)).section("rules", 10, "alice's");
    await eventually(() => keeper(caching, count)(`alice-${step}`), "a kept answer");
    const his = await bob.scope(`bob-${step}`);
    if (step === "listener") await his.onAssemble((_assembly, _context, next) => next());
    else await his.rule("mark", { mutations: [dsp.Mutation.dropSections("section.name == 'rules'")] });
    await (await bob.scope(`carol-${step}`)).section("marker", 1, "after the step");
    await eventually(() => sees(caching, `carol-${step}`, "marker"), "the marker after the step");
    const before = count();
    assert.ok(await sees(caching, `alice-${step}`, "rules"));
    assert.equal(count(), before);
  });
}

test("a static scope is kept once whatever the fields", async () => {
  const { interceptor, count } = assembleCounter();
  const caching = await harness.connect({ localCache: true, interceptors: [interceptor] });
  await (await caching.scope("fields")).section("rules", 10, "be brief");
  await caching.assemble({ scope: "fields", fields: { turn: 0 } });
  const before = count();
  for (let turn = 1; turn < 256; turn += 1) await caching.assemble({ scope: "fields", fields: { turn } });
  assert.equal(count(), before);
});

test("what is kept is bounded by localCacheBytes", async () => {
  const owner = await harness.connect();
  for (const [key, size] of [["a", 30_000], ["b", 30_000], ["huge", 100_000]] as const) {
    await (await owner.scope(key)).section("text", 1, key[0]!.repeat(size)); // two bytes a unit
  }
  const { interceptor, count } = assembleCounter();
  const caching = await harness.connect({ localCache: true, localCacheBytes: 100_000, interceptors: [interceptor] });
  await caching.assemble({ scope: "a" });
  const before = count();
  await caching.assemble({ scope: "a" });
  assert.equal(count(), before); // kept
  await caching.assemble({ scope: "b" });
  await caching.assemble({ scope: "b" });
  assert.equal(count(), before + 1); // b kept, a pushed out
  await caching.assemble({ scope: "a" });
  assert.equal(count(), before + 2);
  await caching.assemble({ scope: "huge" });
  await caching.assemble({ scope: "huge" });
  assert.equal(count(), before + 4); // larger than the budget: never kept
});

test("a localCacheBytes that is no size is refused", async () => {
  for (const size of [0, -1, 1.5, Number.NaN, "1"]) {
    const error = await failure(
      dsp.connect(harness.sidecar.address, { localCache: true, localCacheBytes: size as number }),
    );
    assert.equal(error.reason, "INVALID_VALUE");
    assert.match(error.message, /localCacheBytes/);
  }
});

test("an agent listing its scopes keeps answers, watching each", async () => {
  const folder = temporaryFolder();
  writeFileSync(join(folder, "admin.token"), "admin-token-0123");
  writeFileSync(join(folder, "alice.token"), "alice-token-4567");
  const sidecar = await Sidecar.start({
    config: [
      `auth_token_file = "${join(folder, "admin.token")}"`,
      "[[credentials]]",
      'name = "alice"',
      'role = "agent"',
      `token_file = "${join(folder, "alice.token")}"`,
      'scopes = ["team", "alice", "solo"]',
    ],
  });
  const admin = await dsp.connect(sidecar.address, { token: "admin-token-0123" });
  const { interceptor, count } = assembleCounter();
  const agent = await dsp.connect(sidecar.address, {
    token: "alice-token-4567",
    localCache: true,
    interceptors: [interceptor],
  });
  try {
    const team = await admin.scope("team");
    await (await admin.scope("alice", "team")).section("rules", 10, "alice's");
    const bob = await admin.scope("bob");
    await bob.section("rules", 10, "bob's");
    const kept = keeper(agent, count);
    await eventually(() => kept("alice"), "a kept answer");
    await team.section("parent", 5, "team's");
    await eventually(() => sees(agent, "alice", "parent"), "the parent's change");
    await eventually(() => kept("alice"), "kept again");
    const refused = await failure(agent.assemble({ scope: "bob" }));
    assert.equal(refused.code, grpc.status.PERMISSION_DENIED);
    // the agent's watch of solo's chain is told that kid's end forgot solo's parent
    await forgetsItsParent(admin, agent, kept);
    // a step registered with global in bob's layer runs for alice's assemblies too: the
    // agent's watch of alice's chain is told of it, and the kept answer goes
    await bob.onAssemble(
      (assembly, _context, next) => {
        assembly.sections.push({ name: "marked", text: "by the admin" });
        return next();
      },
      { global: true },
    );
    await eventually(() => sees(agent, "alice", "marked"), "a global step made in bob's scope");
    // its listing of alice's chain shows the step as its watch did: global, without its name
    const listed = await agent.snapshot({ scope: "alice", ancestors: true, kinds: ["listener"] });
    assert.deepEqual(
      listed.registrations.map(({ name, scope, global }) => ({ name, scope, global })),
      [{ name: "", scope: undefined, global: true }],
    );
  } finally {
    await agent.close();
    await admin.close();
    await sidecar.stop();
  }
});
