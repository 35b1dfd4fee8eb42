/**
 * The client's change streams against a sidecar that misbehaves: silence, gaps, events out
 * of order, a stream ended under it. Like scripted.test.ts, every test talks to the
 * scripted sidecar (test/scripted.ts) and the harness checks nothing is left behind.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { bounded, waitFor } from "./helpers.js";
import { change, missed, Script, silence, useScripted, type WatchPeer } from "./scripted.js";

const harness = useScripted();

// -- change events ------------------------------------------------------------------

async function nextItem(changes: dsp.ChangeStream): Promise<dsp.ChangeItem> {
  const item = await changes.next();
  assert.ok(!item.done, "an item");
  return item.value;
}

test("a change stream the sidecar never confirms fails within the call timeout", async () => {
  harness.use(
    new (class extends Script {
      override async watch(): Promise<void> {}
    })(),
  );
  const client = await harness.connect();
  const error = await bounded(client.watchChanges());
  assert.deepEqual([error.code, error.reason], [dsp.Code.UNAVAILABLE, dsp.Reason.SIDECAR_UNAVAILABLE]);
});

test("events after a ChangesMissed resume past its resync revision", async () => {
  const script = harness.use(new Script());
  const client = await harness.connect();
  const changes = await client.watchChanges();
  for (const message of [change(11), missed(12, 3, 14), change(15)]) script.watchers[0]!.send(message);
  const seen = [await nextItem(changes), await nextItem(changes), await nextItem(changes)];
  changes.close();
  assert.deepEqual(
    seen.map((item) => item.type),
    ["change", "missed", "change"],
  );
  assert.deepEqual(seen[1], { type: "missed", firstRevision: 12, count: 3, resyncRevision: 14 });
});

const subscribedAgain = (): pb.WatchChangesResponse =>
  create(pb.WatchChangesResponseSchema, { kind: { case: "subscribed", value: { revision: 1n } } });

for (const [label, wrong] of [
  ["repeated", () => [change(11), change(11)]],
  ["backwards", () => [change(12), change(11)]],
  ["before the subscription", () => [change(9)]],
  ["a gap over a delivered event", () => [change(11), missed(11, 1, 11)]],
  ["a gap ending before it starts", () => [missed(11, 2, 10)]],
  ["subscribed again", () => [change(11), subscribedAgain()]],
] as const) {
  test(`change events out of order reject with a protocol error and end the stream: ${label}`, async () => {
    const script = harness.use(new Script());
    const client = await harness.connect();
    const changes = await client.watchChanges();
    const messages = wrong();
    for (const message of messages) script.watchers[0]!.send(message);
    const error = await bounded(
      (async () => {
        for (let i = 0; i < messages.length; i += 1) await changes.next();
      })(),
    );
    assert.equal(error.reason, dsp.Reason.PROTOCOL_ERROR);
    await script.watchers[0]!.ended;
    assert.deepEqual(await changes.next(), { done: true, value: undefined });
  });
}

for (const end of [{ code: grpc.status.OK }, { code: grpc.status.UNAVAILABLE, message: "restarting" }]) {
  test(`a change stream the sidecar ends (${grpc.status[end.code]}) resumes after the last event delivered`, async () => {
    const script = harness.use(new Script());
    const client = await harness.connect();
    const changes = await client.watchChanges();
    script.watchers[0]!.send(change(11));
    script.watchers[0]!.end(end);
    const first = await nextItem(changes);
    const resumed = nextItem(changes);
    await waitFor(() => script.watchers.length === 2, "the stream subscribes again");
    script.watchers[1]!.send(change(12));
    const second = await resumed;
    changes.close();
    assert.deepEqual(
      [first, second].map((item) => (item.type === "change" ? item.revision : -1)),
      [11, 12],
    );
    assert.equal((script.watchers[1] as WatchPeer).request?.afterRevision, 11n);
  });
}

test("a client closed while its change stream resumes ends the stream", async () => {
  const script = harness.use(
    new (class extends Script {
      override async watch(peer: WatchPeer): Promise<void> {
        if (this.watchers.length === 1) return super.watch(peer);
        peer.end({ code: grpc.status.UNAVAILABLE, message: "still restarting" });
      }
    })(),
  );
  const client = await harness.connect();
  const changes = await client.watchChanges();
  script.watchers[0]!.end({ code: grpc.status.UNAVAILABLE, message: "restarting" });
  const waiting = changes.next();
  await waitFor(() => script.watchers.length >= 2, "the stream tries again");
  await client.close();
  assert.deepEqual(await waiting, { done: true, value: undefined });
});
