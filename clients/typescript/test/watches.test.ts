/** Listings, resumable filtered watches with resyncs, live prompts, and the prompt-cache history. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, useSidecar, waitFor } from "./helpers.js";
import { Sidecar } from "./sidecar.js";

const harness = useSidecar({ config: ["change_history = 4"] });

type View = Map<string, [string, string, string | undefined, string]>;

function viewOf(snapshot: dsp.Snapshot): View {
  return new Map(snapshot.registrations.map((i) => [i.ref, [i.kind, i.name, i.scope, i.fingerprint]]));
}

/** Apply what `changes` yields to `view` until it reaches revision `until`; the item types seen. */
async function follow(changes: dsp.ChangeStream, view: View, until: number): Promise<string[]> {
  const seen: string[] = [];
  while (changes.lastRevision < until) {
    const item = await changes.next();
    assert.ok(!item.done);
    seen.push(item.value.type);
    if (item.value.type === "resynced") {
      view.clear();
      for (const [ref, entry] of viewOf(item.value.snapshot)) view.set(ref, entry);
    } else if (item.value.type === "change") {
      const event = item.value;
      if (event.action === "unregistered") view.delete(event.ref);
      else view.set(event.ref, [event.kind, event.name, event.scope, event.fingerprint]);
    }
  }
  return seen;
}

/** Registrations, updates and disposals: every kind of change (two or three per index). */
async function churn(client: dsp.Client, prefix: string, count: number): Promise<void> {
  for (let index = 0; index < count; index += 1) {
    const handle = await client.section(`${prefix}${index}`, index, "first");
    await handle.update("second");
    if (index % 2) await handle();
  }
}

async function events(changes: dsp.ChangeStream, count: number): Promise<dsp.ChangeEvent[]> {
  const found: dsp.ChangeEvent[] = [];
  while (found.length < count) {
    const item = await changes.next();
    assert.ok(!item.done && item.value.type === "change", `a change event, not ${JSON.stringify(item.value)}`);
    found.push(item.value);
  }
  return found;
}

test("a listing shows each registration with its owner, size and fingerprint; values only when asked", async () => {
  const agent = await harness.connect({ clientName: "agent" });
  const scope = await agent.scope("agent-1");
  await scope.section("rules", 10, "Be precise.");
  await agent.variable("model", "deepseek-v4");
  await agent.context("cwd", 5, () => "/tmp");
  const snapshot = await agent.snapshot();
  const listed = new Map(snapshot.registrations.filter((i) => i.kind !== "scope").map((i) => [i.name, i]));
  const rules = listed.get("rules");
  assert.deepEqual(
    [rules?.kind, rules?.scope, rules?.order, rules?.dynamic, rules?.owner, rules?.sizeBytes, rules?.hasValue],
    ["section", "agent-1", 10, false, "agent", "Be precise.".length, false],
  );
  assert.equal(rules?.fingerprint.length, 16);
  assert.deepEqual([listed.get("cwd")?.dynamic, listed.get("cwd")?.fingerprint], [true, ""]);
  assert.equal(listed.get("model")?.order, undefined);
  assert.equal(listed.get("harness:identity")?.ownerLabel, "built-in");
  const valued = await agent.snapshot({ scope: "agent-1", kinds: ["section"], values: true });
  assert.deepEqual(
    valued.registrations.map((i) => [i.name, i.hasValue, i.value]),
    [["rules", true, "Be precise."]],
  );
  assert.ok(snapshot.incarnation);
});

test("an unknown kind in a filter is refused before anything is sent", async () => {
  const client = await harness.connect();
  const error = await failure(client.snapshot({ kinds: ["sections" as dsp.ChangeKind] }));
  assert.equal(error.reason, dsp.Reason.INVALID_VALUE);
});

test("a watcher that closes and resumes from its last revision misses and duplicates nothing", async () => {
  const watcher = await harness.connect();
  const owner = await harness.connect();
  const changes = await watcher.watchChanges();
  await churn(owner, "before-", 2); // 5 changes
  const seen = await events(changes, 5);
  changes.close();
  await churn(owner, "while-away-", 1); // 2 changes nobody reads: within the history of 4
  const resumed = await watcher.watchChanges({ afterRevision: changes.lastRevision, incarnation: changes.incarnation });
  await owner.section("after", 1, "x");
  const later = await events(resumed, 3);
  const revisions = [...seen, ...later].map((e) => e.revision);
  const first = revisions[0] ?? 0;
  assert.deepEqual(revisions, Array.from({ length: 8 }, (_, i) => first + i));
  assert.deepEqual(later.map((e) => [e.action, e.name]), [
    ["registered", "while-away-0"],
    ["updated", "while-away-0"],
    ["registered", "after"],
  ]);
  resumed.close();
});

test("a watcher behind the history resyncs from a listing to the view of a fresh one", async () => {
  const watcher = await harness.connect();
  const owner = await harness.connect();
  await churn(owner, "kept-", 3);
  const changes = await watcher.watchChanges();
  const [last, incarnation] = [changes.lastRevision, changes.incarnation];
  changes.close();
  await churn(owner, "missed-", 4); // 10 changes: more than the history of 4 holds
  const resumed = await watcher.watchChanges({ afterRevision: last, incarnation });
  await churn(owner, "after-", 2);
  const view: View = new Map();
  const until = (await watcher.snapshot()).revision;
  const seen = await follow(resumed, view, until);
  assert.equal(seen[0], "resynced");
  assert.ok(!seen.slice(1).includes("resynced"));
  assert.deepEqual(view, viewOf(await watcher.snapshot()));
  resumed.close();
});

test("resuming from another incarnation yields a resynced event, reason restarted, with the listing", async () => {
  const client = await harness.connect();
  await client.section("one", 1, "x");
  const changes = await client.watchChanges({ afterRevision: 1, incarnation: "an-older-process" });
  const item = await changes.next();
  assert.ok(!item.done && item.value.type === "resynced");
  assert.equal(item.value.reason, "restarted");
  assert.ok(item.value.snapshot.registrations.some((info) => info.name === "one"));
  assert.equal(changes.lastRevision, item.value.snapshot.revision);
  changes.close();
});

test("a scope filter delivers its layer, and with ancestors its chain", async () => {
  const client = await harness.connect();
  await client.scope("team");
  const agent = await client.scope("agent-9", "team");
  const own = await client.watchChanges({ scope: "agent-9", kinds: ["section"] });
  const chain = await client.watchChanges({ scope: "agent-9", ancestors: true, kinds: ["section"] });
  await client.section("global-x", 1, "g");
  await agent.section("agent-x", 1, "a");
  assert.deepEqual((await events(own, 1)).map((e) => e.name), ["agent-x"]);
  assert.deepEqual((await events(chain, 2)).map((e) => e.name), ["global-x", "agent-x"]);
  own.close();
  chain.close();
});

test("a watch across a sidecar restart resyncs as restarted to the view of a fresh one", async () => {
  const first = await Sidecar.start();
  const address = first.address;
  let second: Sidecar | undefined;
  const owner = await dsp.connect(address);
  const watcher = await dsp.connect(address);
  try {
    const scope = await owner.scope("agent-1");
    const memory = await scope.section("memory", 1, "nothing yet");
    const changes = await watcher.watchChanges();
    const before = changes.incarnation;
    await first.stop();
    second = await Sidecar.restartAt(address);
    await waitFor(() => owner.connected && watcher.connected, "both clients reconnect");
    await memory.update("tea");
    const view: View = new Map();
    const seen = await follow(changes, view, (await watcher.snapshot()).revision);
    assert.equal(seen[0], "resynced");
    assert.notEqual(changes.incarnation, before);
    assert.deepEqual(view, viewOf(await watcher.snapshot()));
    changes.close();
  } finally {
    await owner.close();
    await watcher.close();
    await first.stop();
    await second?.stop();
  }
});

test("a live prompt shows dynamic parts as placeholders, then each update with its cache verdict", async () => {
  const client = await harness.connect();
  const asked: string[] = [];
  const agent = await client.scope("agent-live");
  await client.section("rules", 10, "Be precise.");
  const memory = await agent.section("memory", 50, "Memory: nothing yet.");
  await agent.section("cwd", 60, () => {
    asked.push("cwd");
    return "/work";
  });
  const prompts = await client.watchPrompt({ scope: "agent-live", render: true });
  const first = await prompts.next();
  assert.ok(!first.done);
  assert.match(first.value.prompt ?? "", /<dynamic section "cwd">/);
  assert.deepEqual(first.value.changes, []);
  assert.equal(first.value.report?.stability.hasPrevious, false);
  const revision = await memory.update("Memory: the user likes tea.");
  const change = await prompts.next();
  assert.ok(!change.done);
  assert.deepEqual(
    change.value.changes.map((e) => [e.revision, e.action, e.name]),
    [[revision, "updated", "memory"]],
  );
  assert.match(change.value.prompt ?? "", /the user likes tea/);
  const stability = change.value.report?.stability;
  assert.deepEqual([stability?.hasPrevious, stability?.firstChanged], [true, 'section "memory"']);
  assert.ok((stability?.stableBytes ?? 0) > 0 && (stability?.stableBytes ?? 0) < (stability?.prefix.bytes ?? 0));
  assert.deepEqual(asked, []);
  prompts.close();
  assert.deepEqual(await prompts.next(), { done: true, value: undefined });
});

test("the cache history counts breaks and names the part; reported usage is shown against it", async () => {
  const client = await harness.connect();
  await client.section("rules", 10, "Be precise.");
  await client.section("clock", 30, (context) => `Now: ${String(context.fields["now"])}.`);
  for (const now of ["10:00", "10:01", "10:02"]) {
    await client.assemble({ scope: "agent-c", fields: { now }, report: true, reportKey: "conv" });
  }
  const history = await client.cacheHistory({ reportKey: "conv" });
  assert.equal(history.key, 'key "conv"');
  assert.deepEqual([history.reports, history.breaks, history.breakers], [3, 2, [['section "clock"', 2]]]);
  assert.deepEqual(history.recent.map((e) => e.firstChanged), ["", 'section "clock"', 'section "clock"']);
  const entry = await client.reportUsage(
    { prompt_tokens: 1500, prompt_tokens_details: { cached_tokens: 1280 } },
    { reportKey: "conv" },
  );
  assert.deepEqual([entry.observedCachedTokens, entry.observedPromptTokens], [1280, 1500]);
  assert.deepEqual(dsp.usageFrom({ input_tokens: 20, cache_read_input_tokens: 1000, cache_creation_input_tokens: 5 }), {
    cachedTokens: 1000,
    promptTokens: 1025,
  });
  assert.equal((await failure(client.reportUsage({ total_tokens: 9 }))).reason, dsp.Reason.INVALID_VALUE);
  const unknown = await failure(client.reportUsage({ prompt_cache_hit_tokens: 1 }, { scope: "nobody" }));
  assert.equal(unknown.reason, dsp.Reason.REPORT_NOT_FOUND);
});

test("connect() without an address goes to $DSP_ADDRESS", async () => {
  const saved = process.env["DSP_ADDRESS"];
  process.env["DSP_ADDRESS"] = harness.sidecar.address;
  try {
    const client = await dsp.connect();
    assert.ok(client.sessionId);
    await client.close();
  } finally {
    if (saved === undefined) delete process.env["DSP_ADDRESS"];
    else process.env["DSP_ADDRESS"] = saved;
  }
});
