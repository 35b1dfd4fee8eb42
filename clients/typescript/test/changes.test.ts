/** Change events: one per registration and disposal, in order, as an async iterator. */

import assert from "node:assert/strict";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { useSidecar } from "./helpers.js";

const harness = useSidecar();

async function take(changes: dsp.ChangeStream, count: number): Promise<dsp.ChangeEvent[]> {
  const events: dsp.ChangeEvent[] = [];
  for await (const change of changes) {
    assert.equal(change.type, "change");
    if (change.type === "change") events.push(change);
    if (events.length === count) break;
  }
  return events;
}

test("every registration and disposal is an event, in order, after the subscription", async () => {
  const client = await harness.connect();
  const changes = await client.watchChanges();
  const off = await client.section("rules", 10, "Rules.");
  await client.variable("model", "m");
  const scope = await client.scope("agent");
  await scope.tools(() => []);
  await client.onAssemble(function watcher(assembly, _context, next) {
    return next(assembly);
  });
  await off();
  const events = await take(changes, 6);
  assert.deepEqual(
    events.map((e) => [e.action, e.kind, e.name, e.scope]),
    [
      ["registered", "section", "rules", undefined],
      ["registered", "variable", "model", undefined],
      ["registered", "scope", "agent", "agent"],
      ["registered", "tools", "", "agent"],
      ["registered", "listener", "watcher", undefined],
      ["unregistered", "section", "rules", undefined],
    ],
  );
  const revisions = events.map((e) => e.revision);
  assert.ok(revisions.every((revision, i) => i === 0 || revision > (revisions[i - 1] ?? 0)));
  assert.ok((revisions[0] ?? 0) > changes.revision);
});

test("closing a client emits an unregistered event per registration", async () => {
  const watcher = await harness.connect();
  const client = await harness.connect();
  await client.section("a", 1, "A.");
  await client.context("b", 1, "B.");
  const changes = await watcher.watchChanges();
  await client.close();
  const events = await take(changes, 2);
  assert.deepEqual(
    events.map((e) => [e.action, e.name]).sort(),
    [
      ["unregistered", "a"],
      ["unregistered", "b"],
    ],
  );
});

test("breaking out of the iteration ends the subscription", async () => {
  const client = await harness.connect();
  const changes = await client.watchChanges();
  await client.section("one", 1, "One.");
  await take(changes, 1);
  assert.deepEqual(await changes.next(), { done: true, value: undefined });
});

test("a burst of changes the sidecar sends in one batch is yielded event by event", async () => {
  const watcher = await harness.connect();
  const client = await harness.connect();
  const changes = await watcher.watchChanges();
  const names = Array.from({ length: 20 }, (_, i) => `burst-${i}`);
  await Promise.all(names.map((name, i) => client.section(name, i, "Burst.")));
  const events = await take(changes, names.length);
  assert.deepEqual(events.map((e) => e.name).sort(), [...names].sort());
  const revisions = events.map((e) => e.revision);
  assert.ok(revisions.every((revision, i) => i === 0 || revision === (revisions[i - 1] ?? 0) + 1));
});
