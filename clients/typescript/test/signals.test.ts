/** `{ signal }`: an AbortSignal cancels its call, and one reused over many calls keeps no listener of theirs. */

import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { test } from "node:test";
import * as dsp from "../src/index.js";
import { failure, useSidecar, waitFor } from "./helpers.js";

const harness = useSidecar();

const CALLS = 20;

test("a signal reused over many calls has no abort listener once they are answered", async () => {
  const client = await harness.connect();
  const { signal } = new AbortController();
  for (let i = 0; i < CALLS; i++) await client.render({ signal });
  await client.section("broken", 10, () => {
    throw new TypeError("provider broke");
  });
  for (let i = 0; i < CALLS; i++) await failure(client.assemble({ signal }));
  assert.equal(getEventListeners(signal, "abort").length, 0);
});

test("aborting a signal cancels its call in flight, and leaves no listener", async () => {
  const client = await harness.connect();
  let started = false;
  let stopped = false;
  await client.section("hangs", 10, (context) => {
    started = true;
    context.signal.addEventListener("abort", () => {
      stopped = true;
    });
    return new Promise<string>(() => undefined);
  });
  const controller = new AbortController();
  const call = failure(client.assemble({ signal: controller.signal }));
  await waitFor(() => started, "the provider to be asked");
  assert.equal(getEventListeners(controller.signal, "abort").length, 1);
  controller.abort();
  const error = await call;
  assert.equal(error.code, dsp.Code.CANCELLED);
  assert.equal(getEventListeners(controller.signal, "abort").length, 0);
  await waitFor(() => stopped, "the provider to be told to stop");
});

test("an already-aborted signal fails its call CANCELLED and adds no listener", async () => {
  const client = await harness.connect();
  const signal = AbortSignal.abort();
  const error = await failure(client.assemble({ signal }));
  assert.equal(error.code, dsp.Code.CANCELLED);
  assert.equal(getEventListeners(signal, "abort").length, 0);
});
