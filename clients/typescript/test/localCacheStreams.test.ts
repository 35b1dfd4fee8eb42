/** The local cache against a scripted sidecar whose change stream breaks when the test says: a kept answer makes no call, and none is served while the stream is down or after it resyncs. */

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import * as dsp from "../src/index.js";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { Deferred } from "../src/async.js";
import { waitFor } from "./helpers.js";
import { CALL_TIMEOUT_MS, Script, useScripted, type ListingPeer, type WatchPeer } from "./scripted.js";

const harness = useScripted();

/** Answers every Assemble with one section, `text`, cacheable at `revision`; holds a resubscription until `resume()`, then confirms it with `resumed`. */
class Cacheable extends Script {
  text = "v1";
  revision = 10;
  resumed = create(pb.WatchSubscribedSchema, { revision: 10n, incarnation: "first" });
  listingRevision = 10;
  readonly #gate = new Deferred<void>();

  resume(): void {
    this.#gate.resolve();
  }

  override async watch(peer: WatchPeer): Promise<void> {
    if (this.watchers.length > 1) await this.#gate.promise;
    const subscribed = this.watchers.length > 1 ? this.resumed : create(pb.WatchSubscribedSchema, { revision: 10n, incarnation: "first" });
    peer.send(create(pb.WatchChangesResponseSchema, { kind: { case: "subscribed", value: subscribed } }));
  }

  override async listRegistrations(peer: ListingPeer): Promise<void> {
    peer.send(create(pb.ListRegistrationsResponseSchema, { revision: BigInt(this.listingRevision), incarnation: this.resumed.incarnation }));
    peer.end();
  }

  override async answer(method: string, request: unknown, call: grpc.ServerUnaryCall<unknown, unknown>): Promise<object> {
    if (method !== "Assemble") return super.answer(method, request, call);
    return { assembly: { sections: [{ name: "rules", text: this.text }] }, revision: BigInt(this.revision), cacheable: true };
  }
}

function asked(script: Script): number {
  return script.unary.filter(([method]) => method === "Assemble").length;
}

async function rules(client: dsp.Client): Promise<string | undefined> {
  return (await client.assemble()).sections[0]?.text;
}

async function caching(): Promise<dsp.Client> {
  return dsp.connect(harness.sidecar.address, { callTimeoutMs: CALL_TIMEOUT_MS, localCache: true });
}

/** Run `check` with a client that kept the scripted sidecar's v1, whose change stream then broke (its resubscription waits for `script.resume()`). */
async function withBroken(check: (script: Cacheable, client: dsp.Client) => Promise<void>): Promise<void> {
  const script = harness.use(new Cacheable());
  const client = await caching();
  try {
    await rules(client);
    assert.equal(await rules(client), "v1");
    assert.equal(asked(script), 1); // the second was kept
    script.watchers[0]!.end({ code: grpc.status.UNAVAILABLE, message: "cut" });
    await waitFor(() => script.watchers.length === 2, "the stream resubscribes");
    await check(script, client);
  } finally {
    script.resume();
    await client.close();
  }
}

test("a repeated assemble of a cacheable scope makes no call", async () => {
  const script = harness.use(new Cacheable());
  const client = await caching();
  try {
    await rules(client);
    await rules(client);
    assert.equal(asked(script), 1);
  } finally {
    await client.close();
  }
});

test("while the change stream is down no kept answer is served", () =>
  withBroken(async (script, client) => {
    [script.text, script.revision] = ["v2", 11]; // a change the broken stream does not bring
    assert.equal(await rules(client), "v2");
  }));

test("after a resync no answer kept before it is served", () =>
  withBroken(async (script, client) => {
    // another incarnation, whose revisions are below the kept answer's
    script.resumed = create(pb.WatchSubscribedSchema, { revision: 3n, incarnation: "second", resync: true });
    script.listingRevision = 3;
    script.resume();
    await waitFor(() => script.unary.some(([method]) => method === "ListRegistrations"), "the resync's listing");
    await new Promise((resolve) => setTimeout(resolve, 20)); // let the stream hand over its resync
    [script.text, script.revision] = ["v2", 3];
    assert.equal(await rules(client), "v2");
  }));
