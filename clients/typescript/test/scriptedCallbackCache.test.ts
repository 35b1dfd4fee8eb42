/**
 * Cacheable callbacks on the wire, against a scripted sidecar (test/scripted.ts): the policy
 * each registration sends, the "callback-cache" feature offered and honoured, and
 * `invalidate()` waiting for the sidecar's CacheInvalidated (docs/protocol.md, "Cacheable
 * callbacks"). The twin of clients/go/dsp/scripted_callback_cache_test.go.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import * as dsp from "../src/index.js";
import * as pb from "../src/gen/dsh/systemprompt/v1/system_prompt_pb.js";
import { failure } from "./helpers.js";
import { CALL_TIMEOUT_MS, Script, useScripted, type SessionPeer } from "./scripted.js";

const harness = useScripted();

/** A script whose sessions and listener streams confirm `features`. */
function confirming(...features: string[]): Script {
  const script = harness.use(new Script());
  script.sessionFeatures = features;
  script.listenerFeatures = ["tool-slots", ...features];
  return script;
}

/** The next CacheInvalidate the client sent on `session`. */
async function invalidateOn(session: SessionPeer): Promise<pb.CacheInvalidate> {
  const message = await session.next();
  assert.equal(message.kind.case, "invalidate");
  return message.kind.value as pb.CacheInvalidate;
}

function invalidated(invalidateId: bigint): pb.OpenSessionResponse {
  return create(pb.OpenSessionResponseSchema, { kind: { case: "invalidated", value: { invalidateId } } });
}

/** Whether `promise` settled by the time the client's next few events ran. */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  let done = false;
  void promise.then(() => (done = true));
  await new Promise((resolve) => setTimeout(resolve, 50));
  return done;
}

test("the session offers callback-cache and each policy is sent as declared", async () => {
  const script = confirming();
  const client = await harness.connect();
  const start = script.sessions[0]?.start?.kind;
  assert.ok(start?.case === "start" && start.value.features.includes("callback-cache"));
  const text = (): string => "x";
  await client.section("plain", 1, text);
  await client.section("revision", 1, text, { cache: dsp.Cache.REVISION });
  await client.section("fields", 1, text, { cache: dsp.Cache.FIELDS });
  await client.section("ttl", 1, text, { cache: dsp.Cache.ttl(1.5, { fields: true }) });
  const policies = script.unary
    .filter(([method]) => method === "RegisterSection")
    .map(([, request]) => {
      const section = request as pb.RegisterSectionRequest;
      const cache = section.textSource.case === "dynamic" ? section.textSource.value.cache : undefined;
      return `${section.name}:${cache === undefined ? "none" : `${pb.CacheDependency[cache.dependsOn]}/${cache.ttlS}`}`;
    });
  assert.deepEqual(policies, ["plain:none", "revision:REVISION/0", "fields:CONTEXT/0", "ttl:CONTEXT/1.5"]);
});

test("invalidate() resolves once the sidecar confirms its own invalidation", async () => {
  const script = confirming("callback-cache");
  const client = await harness.connect();
  const handle = await client.section("dynamic", 1, () => "x", { cache: dsp.Cache.REVISION });
  const session = script.sessions[0]!;
  const done = handle.invalidate();
  const invalidate = await invalidateOn(session);
  assert.equal(invalidate.providerKeys.length, 1);
  session.send(invalidated(invalidate.invalidateId + 1n)); // another invalidation's: not this one's
  assert.equal(await settled(done), false);
  session.send(invalidated(invalidate.invalidateId));
  await done;
});

test("an invalidation the sidecar never confirms fails within the call timeout", async () => {
  confirming("callback-cache");
  const client = await harness.connect();
  const handle = await client.section("dynamic", 1, () => "x", { cache: dsp.Cache.REVISION });
  const error = await failure(handle.invalidate());
  assert.deepEqual(
    [error.code, error.reason, error.message],
    [
      dsp.Code.UNAVAILABLE,
      dsp.Reason.SIDECAR_UNAVAILABLE,
      `sidecar unavailable: no answer to a cache invalidation within ${CALL_TIMEOUT_MS / 1000}s`,
    ],
  );
});

test("an invalidation whose session ends is done", async () => {
  const script = confirming("callback-cache");
  const client = await harness.connect();
  const handle = await client.section("dynamic", 1, () => "x", { cache: dsp.Cache.REVISION });
  const done = handle.invalidate();
  const session = script.sessions[0]!;
  await invalidateOn(session);
  session.end(); // the session is over: what it registered is cached no more
  await done;
});

test("a sidecar without the feature is sent no invalidation", async () => {
  const script = confirming(); // confirms no feature
  const client = await harness.connect();
  const handle = await client.section("dynamic", 1, () => "x", { cache: dsp.Cache.REVISION });
  await handle.invalidate();
  await assert.rejects(script.sessions[0]!.take(300), /nothing from the client/);
});

test("a listener offers callback-cache and invalidates on its own stream", async () => {
  const script = confirming("callback-cache");
  const client = await harness.connect();
  const listener = await client.onAssemble((assembly, _context, next) => next(assembly), {
    cache: dsp.Cache.FIELDS,
  });
  const stream = script.listeners[0]!;
  const start = stream.start?.kind;
  assert.ok(start?.case === "start");
  assert.ok(start.value.features.includes("callback-cache"));
  assert.equal(start.value.cache?.dependsOn, pb.CacheDependency.CONTEXT);
  const done = listener.invalidate();
  const message = await stream.next();
  assert.equal(message.kind.case, "invalidate");
  const invalidateId = (message.kind.value as pb.CacheInvalidate).invalidateId;
  stream.send(create(pb.ListenResponseSchema, { kind: { case: "invalidated", value: { invalidateId } } }));
  await done;
});
